/* kvtier._native's embedding cache (_emb.c): EmbeddingCache and Embedding, added to the module
 * by its init. Include after Python.h. */
#ifndef KVT_PY_EMB_H
#define KVT_PY_EMB_H

/* Add the two types to module; error is kvtier.Error. 0, or -1 with an exception set. */
int kvt_py_emb_add(PyObject *module, PyObject *error);

#endif
