"""SGLang's multimodal embedding cache, kept by kvtier: MultimodalCache has the interface of
SGLang's MultimodalCache (get, set, has, free, available_size; combine_hashes) over an
EmbeddingCache, so that an embedding evicted from the device comes back from host memory,
from a data dir (across restarts) or from a Redis server shared by engines, instead of from the
vision encoder.

Items are named as SGLang names them: an mm_hash (an int, hashed to 32 bytes) or a 32-byte
identity (bytes). Embeddings are arrays: numpy arrays keep their dtype and shape (a small head
before the bytes); anything else with the buffer protocol is kept as bytes. get returns a
numpy array when numpy is installed, else (dtype, shape, bytes).

    import kvtier, kvtier.mm
    cache = kvtier.mm.MultimodalCache(kvtier.EmbeddingCache(1 << 30, host_bytes=8 << 30,
                                                            dir="/data/emb"))
    if cache.get([h]) is None:
        cache.set(h, encoder(image))

Unlike SGLang's (whose tensors live in device memory and are returned as they are), get
copies the embedding out: on a GPU, copy it to the device where it is used.
"""
import hashlib
import struct

_MAGIC = b"KVTARR1\0"


def item_key(mm_hash):
    """The 32 bytes naming an item: a 32-byte identity as it is, an int by SHA256 of its
    bytes (so that 64-bit hashes spread over the whole key)."""
    if isinstance(mm_hash, (bytes, bytearray, memoryview)):
        b = bytes(mm_hash)
        if len(b) != 32:
            raise ValueError(f"an identity is 32 bytes, not {len(b)}")
        return b
    if isinstance(mm_hash, int):
        n = mm_hash & ((1 << 256) - 1)
        return hashlib.sha256(b"kvtier/mm/1" + n.to_bytes(32, "big")).digest()
    raise TypeError(f"mm_hash must be an int or 32 bytes, not {type(mm_hash).__name__}")


def encode(value):
    """An embedding's bytes with its dtype and shape in front."""
    dtype, shape = "|u1", None
    if hasattr(value, "dtype") and hasattr(value, "shape") and hasattr(value, "tobytes"):
        dtype, shape, data = value.dtype.str, tuple(value.shape), value.tobytes()
    else:
        data = memoryview(value).cast("B").tobytes()
        shape = (len(data),)
    d = dtype.encode()
    head = _MAGIC + struct.pack("<B", len(d)) + d + struct.pack(f"<B{len(shape)}Q", len(shape),
                                                                 *shape)
    return head + data


def decode(blob):
    """What encode made: a numpy array when numpy is installed, else (dtype, shape, bytes)."""
    mv = memoryview(blob)
    if bytes(mv[:8]) != _MAGIC:
        raise ValueError("not an embedding kvtier.mm wrote")
    n = mv[8]
    dtype = bytes(mv[9:9 + n]).decode()
    ndim = mv[9 + n]
    shape = struct.unpack_from(f"<{ndim}Q", mv, 10 + n)
    data = mv[10 + n + 8 * ndim:]
    try:
        import numpy
    except ImportError:
        return dtype, shape, bytes(data)
    return numpy.frombuffer(bytes(data), dtype=numpy.dtype(dtype)).reshape(shape)


class MultimodalCache:
    """SGLang's MultimodalCache interface over a kvtier.EmbeddingCache (which it owns: close
    closes it). ns (bytes) is the namespace of every item: a LoRA adapter of the encoder, a
    cache salt."""

    def __init__(self, cache, ns=b""):
        self.cache, self.ns = cache, ns

    @staticmethod
    def combine_hashes(mm_hashes):
        """SGLang's: one hash for the items of a request, None for none."""
        return hash(tuple(mm_hashes)) if mm_hashes else None

    def get(self, mm_hashes, combined_hash=None):
        """The embedding set under the combined hash of mm_hashes, or None."""
        h = self.combine_hashes(mm_hashes) if combined_hash is None else combined_hash
        return None if h is None else self.get_single(h)

    def get_single(self, mm_hash):
        blob = self.cache.get(item_key(mm_hash), self.ns)
        return None if blob is None else decode(blob)

    def set(self, mm_hash, embedding, loc=None):
        """Cache embedding under mm_hash: False when the cache refused it (larger than its
        device budget, or no room beside embeddings in use), as SGLang's set."""
        return self.cache.put(item_key(mm_hash), encode(embedding), self.ns)

    def has(self, mm_hash):
        return self.cache.lookup(item_key(mm_hash), self.ns) is not None

    def free(self, mm_hash, mm_embedding_allocator=None):
        """Drop it from the device and host (the disk and remote tiers keep theirs)."""
        return self.cache.drop(item_key(mm_hash), self.ns)

    def available_size(self):
        """Embeddings on the device, as SGLang's (its entry count)."""
        return self.cache.stats()["device_embeddings"]

    def __len__(self):
        return self.available_size()

    def close(self):
        self.cache.close()
