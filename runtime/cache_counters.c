/*
 * cache_counters.c — the process counters of cache_counters.h: one struct under one mutex, added
 * to by lookups and stores (cache_load_store.c), lock waits (cache_lock.c), evictions (cache_prune.c) and the
 * JIT's compiles, read by cache_counters_get.
 */
#include <pthread.h>

#include "cache_counters.h"

static pthread_mutex_t cache_counter_lock = PTHREAD_MUTEX_INITIALIZER;
static cache_counters cache_count;

void cache_counters_get(cache_counters *out)
{
    pthread_mutex_lock(&cache_counter_lock);
    *out = cache_count;
    pthread_mutex_unlock(&cache_counter_lock);
}

void cache_note_compile(double ms, double cpu_ms)
{
    pthread_mutex_lock(&cache_counter_lock);
    cache_count.compiles++;
    cache_count.compile_ms += ms;
    if (cpu_ms > 0) cache_count.compile_cpu_ms += cpu_ms;
    pthread_mutex_unlock(&cache_counter_lock);
}

void cache_count_lookup(int hit, size_t bytes)
{
    pthread_mutex_lock(&cache_counter_lock);
    if (hit) {
        cache_count.hits++;
        cache_count.hit_bytes += bytes;
    } else {
        cache_count.misses++;
    }
    pthread_mutex_unlock(&cache_counter_lock);
}

void cache_count_store(uint64_t bytes)
{
    pthread_mutex_lock(&cache_counter_lock);
    cache_count.stores++;
    cache_count.store_bytes += bytes;
    pthread_mutex_unlock(&cache_counter_lock);
}

void cache_count_lock_wait(double ms)
{
    pthread_mutex_lock(&cache_counter_lock);
    cache_count.lock_waits++;
    cache_count.lock_wait_ms += ms;
    pthread_mutex_unlock(&cache_counter_lock);
}

void cache_count_evicted(uint64_t evicted, uint64_t bytes)
{
    pthread_mutex_lock(&cache_counter_lock);
    cache_count.evicted += evicted;
    cache_count.evicted_bytes += bytes;
    pthread_mutex_unlock(&cache_counter_lock);
}
