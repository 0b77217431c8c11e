/* The multimodal embedding cache's calls for the engine (embeddings.c; the cache: src/emb/). */
#ifndef KVT_ENGINE_EMBEDDINGS_H
#define KVT_ENGINE_EMBEDDINGS_H

#include "engine/engine_int.h"

/* The embedding cache's ops: apply those finished; wait for them all. Nothing without an
 * embedding cache. */
void engine_emb_poll(kvt_engine *e);
void engine_emb_sync(kvt_engine *e);

#endif
