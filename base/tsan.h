/*
 * Hand-overs that ThreadSanitizer cannot see.
 *
 * A pointer passed from one thread to another as the bytes of a ZeroMQ
 * message (an inproc PUSH/PULL pair) is ordered by libzmq's lock-free pipes,
 * whose atomics are compiled into libzmq, outside TSan's instrumentation: to
 * TSan the receiver's reads of what the sender wrote look unordered.  The
 * sender marks the object with FB_TSAN_RELEASE(p) just before zmq_send, the
 * receiver with FB_TSAN_ACQUIRE(p) just after zmq_recv; TSan then orders the
 * two as the pipe does.  They add no synchronisation of their own, and
 * outside a TSan build they are nothing.
 */
#ifndef FB_TSAN_H
#define FB_TSAN_H

#if defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define FB_TSAN 1
#endif
#endif
#if defined(__SANITIZE_THREAD__) && !defined(FB_TSAN)
#define FB_TSAN 1
#endif

#ifdef FB_TSAN
/* the TSan runtime's own entry points (sanitizer/tsan_interface.h) */
void __tsan_acquire(void *addr);
void __tsan_release(void *addr);
#define FB_TSAN_ACQUIRE(p) __tsan_acquire((void *)(p))
#define FB_TSAN_RELEASE(p) __tsan_release((void *)(p))
#else
#define FB_TSAN_ACQUIRE(p) ((void)(p))
#define FB_TSAN_RELEASE(p) ((void)(p))
#endif

#endif
