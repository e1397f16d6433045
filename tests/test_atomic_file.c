/*
 * test_atomic_file.c — base/atomic_file.c, the temp-file-and-rename writer of the kernel cache
 * and the tune table: a reader sees the old content or the new, a failure at any stage leaves
 * the old file and no temporary file, and the stage that failed comes back with its errno.
 */
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <unistd.h>

#include "atomic_file.h"
#include "check.h"
#include "tmpdir.h"

typedef struct fill_case {
    const char *text;
    int fail_errno; /* 0: write text; else write half of it and fail with this errno */
    int refuse_rename;
} fill_case;

static int fill(int fd, void *arg)
{
    const fill_case *c = arg;
    size_t n = strlen(c->text);
    if (!c->fail_errno) return atomic_file_write_all(fd, c->text, n);
    (void)atomic_file_write_all(fd, c->text, n / 2);
    errno = c->fail_errno;
    return -1;
}

static int before_rename(void *arg)
{
    const fill_case *c = arg;
    if (!c->refuse_rename) return 0;
    errno = EACCES;
    return -1;
}

static void read_text(const char *path, char *out, size_t cap)
{
    out[0] = '\0';
    int fd = open(path, O_RDONLY);
    if (fd < 0) return;
    ssize_t n = read(fd, out, cap - 1);
    out[n > 0 ? n : 0] = '\0';
    close(fd);
}

static int count_temps(const char *dir)
{
    int n = 0;
    DIR *d = opendir(dir);
    struct dirent *de;
    while (d && (de = readdir(d))) n += strstr(de->d_name, ATOMIC_FILE_TEMP_INFIX) != NULL;
    if (d) closedir(d);
    return n;
}

/* Writes "old" then tries c: the stage, errno and what path holds afterwards. */
static void check_case(const fill_case *c, atomic_file_stage want, int want_errno, const char *left)
{
    char dir[TEST_PATH_MAX], path[TEST_PATH_MAX], tmp[TEST_PATH_MAX], text[64];
    make_tmpdir_named(dir, "flce-afile");
    join(path, dir, "file.txt");
    fill_case old = {"old", 0, 0};
    atomic_file_writer w0 = {fill, NULL, &old};
    CHECK(atomic_file_write(path, &w0, tmp, sizeof tmp) == ATOMIC_FILE_DONE);
    atomic_file_writer w = {fill, before_rename, (void *)c};
    atomic_file_stage got = atomic_file_write(path, &w, tmp, sizeof tmp);
    int err = errno;
    CHECKF(got == want, "stage %d, want %d", (int)got, (int)want);
    if (want != ATOMIC_FILE_DONE) CHECKF(err == want_errno, "errno %d, want %d", err, want_errno);
    CHECKF(strncmp(tmp, path, strlen(path)) == 0 && strstr(tmp, ".tmp."), "temp name %s", tmp);
    read_text(path, text, sizeof text);
    CHECKF(strcmp(text, left) == 0, "'%s', want '%s'", text, left);
    CHECK(count_temps(dir) == 0);
    remove_tree(dir);
}

static void new_content_replaces_the_old(void)
{
    fill_case c = {"new content", 0, 0};
    check_case(&c, ATOMIC_FILE_DONE, 0, "new content");
}

static void failed_fill_keeps_the_old_file_and_its_errno(void)
{
    fill_case c = {"new content", ENOSPC, 0};
    check_case(&c, ATOMIC_FILE_WRITE, ENOSPC, "old");
}

static void refused_rename_keeps_the_old_file(void)
{
    fill_case c = {"new content", 0, 1};
    check_case(&c, ATOMIC_FILE_RENAME, EACCES, "old");
}

static void missing_directory_fails_at_create(void)
{
    char tmp[TEST_PATH_MAX];
    fill_case c = {"x", 0, 0};
    atomic_file_writer w = {fill, NULL, &c};
    atomic_file_stage got = atomic_file_write("/nonexistent-flce-dir/file", &w, tmp, sizeof tmp);
    CHECK(got == ATOMIC_FILE_CREATE);
    CHECK(errno == ENOENT);
}

static void temp_name_too_long_fails_at_create_with_no_name(void)
{
    char tmp[16];
    fill_case c = {"x", 0, 0};
    atomic_file_writer w = {fill, NULL, &c};
    CHECK(atomic_file_write("/tmp/some-file-name", &w, tmp, sizeof tmp) == ATOMIC_FILE_CREATE);
    CHECK(errno == ENAMETOOLONG);
    CHECK(tmp[0] == '\0');
}

int main(void)
{
    RUN(new_content_replaces_the_old);
    RUN(failed_fill_keeps_the_old_file_and_its_errno);
    RUN(refused_rename_keeps_the_old_file);
    RUN(missing_directory_fails_at_create);
    RUN(temp_name_too_long_fails_at_create_with_no_name);
    FINISH();
}
