/*
 * dynload.h — opens a shared library at run time by its usual names, so libflce.so needs NVRTC only
 * when it compiles and NCCL only for collectives (issue 17): one build loads beside CUDA 12 and 13
 * applications and on machines without NCCL. Used by nvrtc_compile.c and comm.c.
 *
 * Where a library is looked for, in this order (issue 41 item 3):
 *   1. `override` (FLCE_NVRTC_LIBRARY, FLCE_NCCL_LIBRARY) when set and non-empty: the only path tried;
 *   2. each name as it is: the dynamic loader's search (LD_LIBRARY_PATH, the ld.so cache, a library
 *      the process already loaded, such as the copy PyTorch loaded from its NVIDIA wheels);
 *   3. the NVIDIA pip wheels' copies (`wheel_files`, paths like nvidia/cu13/lib/libnvrtc.so.13) under
 *      each Python site-packages directory of this fixed set, in this order:
 *        - the site-packages (or dist-packages) directory that holds flce's own file, one or two
 *          levels up (libflce.so.0 in site-packages/flce/, the tool in site-packages/flce/bin/);
 *        - each entry of PYTHONPATH;
 *        - $VIRTUAL_ENV/lib/python3.X/site-packages, $CONDA_PREFIX/lib/python3.X/site-packages
 *          (every X found);
 *        - for each directory of PATH holding a python3 or python executable, ../lib/python3.X/
 *          site-packages and ../lib/python3.X/dist-packages;
 *        - $HOME/.local/lib/python3.X/site-packages (pip install --user);
 *   4. each name in the toolkit library directory the build saw (FLCE_TOOLKIT_LIB_DIR).
 * A failure's message lists every place tried (the site-packages directories by name).
 */
#ifndef FLCE_DYNLOAD_H
#define FLCE_DYNLOAD_H

#include <stddef.h>

/* The first library found as above: `names` and `wheel_files` are NULL-terminated (`wheel_files`
 * may be NULL). NULL when none loads: `why` then lists what was tried and dlerror's words. */
void *dyn_open(const char *const *names, const char *const *wheel_files, const char *override, char *why,
               size_t cap);

/* dyn_open, then each of the n symbol names into the matching slot of `table`, a struct of n function
 * pointers in the same order. 1 when all loaded; else 0 with what was tried or the missing symbol
 * in `why`. */
int dyn_load_table(const char *const *libs, const char *const *wheel_files, const char *override,
                   const char *const *syms, int n, void *table, char *why, size_t cap);

/* The file of the library behind a table dyn_load_table filled (its first symbol's), or NULL. */
const char *dyn_file_of(const void *table);

#endif
