"""The paged KV-cache write's reference: the caches with each token's rows at its slot, on whichever array
module holds them (the caches are the reference's own copies)."""


def paged_kv_write(key, value, key_cache, value_cache, slot_mapping, tokens, xp):
    shape = key_cache.shape
    slots = shape[0] * shape[1]
    key_cache = key_cache.reshape(slots, *shape[2:])
    value_cache = value_cache.reshape(slots, *shape[2:])
    key_cache[slot_mapping] = key
    value_cache[slot_mapping] = value
    return {"key_cache": key_cache.reshape(shape), "value_cache": value_cache.reshape(shape)}
