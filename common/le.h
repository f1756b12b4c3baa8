/* Little-endian loads and stores at any alignment, so that no code depends
 * on the host's byte order (the wire's numbers and rows). On little-endian
 * hosts they are memcpy of the native value (one move, and loops over them
 * vectorise); elsewhere they go byte by byte. */
#ifndef MOEX_LE_H
#define MOEX_LE_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* On little-endian hosts a native value's bytes are its wire bytes. */
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
#define MOEX_HOST_LE 1
#else
#define MOEX_HOST_LE 0
#endif

#if MOEX_HOST_LE
static inline void moex_put_u16(uint8_t *p, uint16_t v) { memcpy(p, &v, 2); }
static inline void moex_put_u32(uint8_t *p, uint32_t v) { memcpy(p, &v, 4); }
static inline void moex_put_u64(uint8_t *p, uint64_t v) { memcpy(p, &v, 8); }
static inline uint16_t moex_get_u16(const uint8_t *p) { uint16_t v; memcpy(&v, p, 2); return v; }
static inline uint32_t moex_get_u32(const uint8_t *p) { uint32_t v; memcpy(&v, p, 4); return v; }
static inline uint64_t moex_get_u64(const uint8_t *p) { uint64_t v; memcpy(&v, p, 8); return v; }
#else
static inline void moex_put_u16(uint8_t *p, uint16_t v) {
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}
static inline void moex_put_u32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static inline void moex_put_u64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static inline uint16_t moex_get_u16(const uint8_t *p) {
    return (uint16_t)(p[0] | (p[1] << 8));
}
static inline uint32_t moex_get_u32(const uint8_t *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}
static inline uint64_t moex_get_u64(const uint8_t *p) {
    return (uint64_t)moex_get_u32(p) | ((uint64_t)moex_get_u32(p + 4) << 32);
}
#endif
/* Arrays of u16 between native and wire order. */
static inline void moex_put_u16_array(uint8_t *dst, const uint16_t *src, size_t n) {
#if MOEX_HOST_LE
    memcpy(dst, src, 2 * n);
#else
    for (size_t i = 0; i < n; i++) moex_put_u16(dst + 2 * i, src[i]);
#endif
}
static inline void moex_get_u16_array(uint16_t *dst, const uint8_t *src, size_t n) {
#if MOEX_HOST_LE
    memcpy(dst, src, 2 * n);
#else
    for (size_t i = 0; i < n; i++) dst[i] = moex_get_u16(src + 2 * i);
#endif
}

static inline void moex_put_f32(uint8_t *p, float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    moex_put_u32(p, u);
}
static inline float moex_get_f32(const uint8_t *p) {
    uint32_t u = moex_get_u32(p);
    float f;
    memcpy(&f, &u, 4);
    return f;
}

#endif
