# The vendored xxHash (BSD-2, see _vendor/LICENSE.xxhash), compiled inline into each module
# that cimports this file, and the little-endian stores of the canonical encoding.
from libc.stdint cimport uint32_t, uint64_t


cdef extern from *:
    """
    #define XXH_INLINE_ALL
    #include "xxhash.h"
    """
    ctypedef struct XXH128_hash_t:
        uint64_t low64
        uint64_t high64

    ctypedef struct XXH3_state_t:
        pass

    XXH128_hash_t XXH3_128bits(const void* data, size_t length) nogil
    uint64_t XXH3_64bits(const void* data, size_t length) nogil
    XXH3_state_t* XXH3_createState() nogil
    void XXH3_freeState(XXH3_state_t* state) nogil
    int XXH3_128bits_reset(XXH3_state_t* state) nogil
    int XXH3_128bits_update(XXH3_state_t* state, const void* data, size_t length) nogil
    XXH128_hash_t XXH3_128bits_digest(const XXH3_state_t* state) nogil


cdef extern from "ir_canon.h":
    void ir_store_u32le(char* p, uint32_t v) nogil
    void ir_store_u64le(char* p, uint64_t v) nogil
    char* ir_put_len(char* p, char tag, uint32_t n) nogil
    char* ir_put_u64(char* p, char tag, uint64_t v) nogil
    char* ir_put_hash(char* p, uint64_t lo, uint64_t hi) nogil


cdef extern from "Python.h":
    object _PyLong_FromByteArray(const unsigned char* data, size_t n, int little_endian,
                                 int is_signed)


cdef inline object u128(uint64_t lo, uint64_t hi):
    """A 128-bit hash as a Python int, built in one call."""
    cdef char raw[16]
    ir_store_u64le(raw, lo)
    ir_store_u64le(raw + 8, hi)
    return _PyLong_FromByteArray(<const unsigned char*>raw, 16, 1, 0)
