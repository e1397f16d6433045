/*
 * atomic_file.h — replacing a file so that a reader sees the old content or the new one, never a
 * part: the content goes into a new temporary file in the same directory,
 * "<path>.tmp.<pid>.<16 hex>", which is renamed over path once it is complete and closed. The one
 * writer of the kernel cache's entries (runtime/cache_load_store.c) and of the tune table
 * (runtime/tune_table.c).
 *
 * No fsync: both callers' files are checked when they are read (checksums), and a torn file after
 * a crash is recomputed, which is cheaper than an fsync per store on every rank's file system.
 */
#ifndef FLCE_ATOMIC_FILE_H
#define FLCE_ATOMIC_FILE_H

#include <stddef.h>

/* Part of every temporary file's name: the cache's cleanup recognizes its temp files by it. */
#define ATOMIC_FILE_TEMP_INFIX ".tmp."

/* Where atomic_file_write stopped. */
typedef enum atomic_file_stage {
    ATOMIC_FILE_DONE = 0, /* path holds the new content */
    ATOMIC_FILE_CREATE,   /* no temporary file (name too long: ENAMETOOLONG, or open failed) */
    ATOMIC_FILE_WRITE,    /* fill, or close, failed */
    ATOMIC_FILE_RENAME    /* before_rename gave up, or rename failed */
} atomic_file_stage;

typedef struct atomic_file_writer {
    /* Writes the whole content into fd; 0, or -1 with errno set. */
    int (*fill)(int fd, void *arg);
    /* Optional; called once the temporary file is complete and closed: 0 renames it into place,
     * -1 (errno set) gives up. The kernel cache's injected rename failure (runtime/fault.h). */
    int (*before_rename)(void *arg);
    void *arg;
} atomic_file_writer;

/* Writes path through a temporary file. ATOMIC_FILE_DONE, or the stage that failed with errno
 * set, the temporary file removed and path untouched. tmp (cap bytes, caller's) receives the
 * temporary file's name for messages, "" when no name fitted. Thread-safe. */
atomic_file_stage atomic_file_write(const char *path, const atomic_file_writer *w, char *tmp,
                                    size_t cap);

/* write(2) until all n bytes are out, retrying EINTR; 0, or -1 with errno set. */
int atomic_file_write_all(int fd, const void *buf, size_t n);

#endif
