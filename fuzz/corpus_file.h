/*
 * corpus_file.h — reads one corpus file for the drivers that walk a corpus (replay.c,
 * spec_compile.c): the whole file in a buffer of exactly its size, as libFuzzer hands inputs over,
 * so ASan builds catch a read one byte past the input.
 */
#ifndef FLCE_CORPUS_FILE_H
#define FLCE_CORPUS_FILE_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>

/* NULL on error; the caller frees. */
static uint8_t *read_file(const char *path, size_t *size)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    uint8_t *buf = NULL;
    struct stat st;
    if (fstat(fileno(f), &st) == 0 && S_ISREG(st.st_mode)) {
        *size = (size_t)st.st_size;
        buf = malloc(*size ? *size : 1);
        if (buf && fread(buf, 1, *size, f) != *size) {
            free(buf);
            buf = NULL;
        }
    }
    fclose(f);
    return buf;
}

#endif
