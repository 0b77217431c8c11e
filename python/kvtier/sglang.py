"""kvtier as an SGLang HiCache storage backend (KvtierHiCacheStorage): the adapter lands here."""
