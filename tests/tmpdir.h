/*
 * tmpdir.h — scratch directories for the CPU tests that touch the file system (test_cache,
 * test_fault): a fresh mkdtemp directory per case, path joining, and rm -rf that restores write
 * permission on the way down (the read-only cases chmod directories).
 */
#ifndef FLCE_TMPDIR_H
#define FLCE_TMPDIR_H

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define TEST_PATH_MAX 4096

/* out = a new directory /tmp/<prefix>.XXXXXX; exits the test on failure. */
static void make_tmpdir_named(char *out, const char *prefix)
{
    snprintf(out, TEST_PATH_MAX, "/tmp/%s.XXXXXX", prefix);
    if (!mkdtemp(out)) {
        fprintf(stderr, "mkdtemp: %s\n", strerror(errno));
        exit(1);
    }
}

static void join(char *out, const char *dir, const char *name)
{
    if (snprintf(out, TEST_PATH_MAX, "%s/%s", dir, name) >= TEST_PATH_MAX) {
        fprintf(stderr, "path too long: %s/%s\n", dir, name);
        exit(1);
    }
}

static void remove_tree(const char *path)
{
    struct stat st;
    if (lstat(path, &st) != 0) return;
    if (!S_ISDIR(st.st_mode)) {
        unlink(path);
        return;
    }
    chmod(path, 0700);
    DIR *d = opendir(path);
    struct dirent *de;
    while (d && (de = readdir(d)) != NULL) {
        char child[TEST_PATH_MAX];
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..")) continue;
        join(child, path, de->d_name);
        remove_tree(child);
    }
    if (d) closedir(d);
    rmdir(path);
}

#endif
