/* registry.c - pick a compute backend by name.
 *
 * "cpu" is built in.  "cuda[:N]" lives in a module, libcbcore-cuda.so
 * (lib/cuda/, built when nvcc is found), loaded with dlopen the first time
 * it is asked for: programs linked against libcbcore start without loading
 * the CUDA runtime and cuBLAS (about 60 ms a start, and 1.3 s cold, on this
 * project's machines), and a build without nvcc differs only in the module
 * being absent.  The module is looked for at, in order:
 *   $CB_CUDA_MODULE (a path)
 *   the directory of the program or library that holds this code, and its
 *   ../lib (bin/cb-run finds lib/libcbcore-cuda.so in the build tree and
 *   under PREFIX once installed)
 *   CB_LIBDIR (the install directory compiled in)
 *   the dynamic linker's search path.
 * No name is the CPU.  "auto" tries CUDA only when the NVIDIA driver's
 * device nodes exist, and any failure there falls back to the CPU (the
 * programs' default).  $CB_BACKEND_FAIL_AT=N wraps whichever backend
 * opened in the tests' fault injection (cb_backend_fail_at, fault.c). */
#include "backend.h"
#include "blas.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifndef CB_LIBDIR
#define CB_LIBDIR "/usr/local/lib"
#endif
#define CUDA_MODULE "libcbcore-cuda.so"

static pthread_mutex_t mod_mu = PTHREAD_MUTEX_INITIALIZER;
static cb_cuda_open_fn mod_open; /* the module's entry, once loaded */
static char mod_why[640];        /* why it could not be loaded */
static int mod_tried;

static void *try_open(const char *path, char *why, size_t n)
{
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h && access(path, F_OK) == 0) /* present but unloadable: say why */
        snprintf(why, n, "%s", dlerror());
    return h;
}

/* Load the module once; NULL with mod_why set when it is not there. */
static cb_cuda_open_fn cuda_module(void)
{
    pthread_mutex_lock(&mod_mu);
    if (!mod_tried) {
        char cand[4][4096], why[512] = "", dir[4096] = "";
        int nc = 0;
        void *h = NULL;
        Dl_info info;
        const char *env = getenv("CB_CUDA_MODULE");

        mod_tried = 1;
        if (dladdr((void *)cb_backend_open, &info) && info.dli_fname) {
            snprintf(dir, sizeof dir, "%s", info.dli_fname);
            char *slash = strrchr(dir, '/');
            if (slash)
                *slash = 0;
            else
                snprintf(dir, sizeof dir, ".");
        }
        if (env && *env)
            snprintf(cand[nc++], sizeof cand[0], "%s", env);
        if (dir[0]) {
            snprintf(cand[nc++], sizeof cand[0], "%s/%s", dir, CUDA_MODULE);
            snprintf(cand[nc++], sizeof cand[0], "%s/../lib/%s", dir, CUDA_MODULE);
        }
        snprintf(cand[nc++], sizeof cand[0], "%s/%s", CB_LIBDIR, CUDA_MODULE);
        for (int i = 0; i < nc && !h; i++)
            h = try_open(cand[i], why, sizeof why);
        if (!h && !why[0])
            h = dlopen(CUDA_MODULE, RTLD_NOW | RTLD_LOCAL);
        if (h) {
            mod_open = (cb_cuda_open_fn)dlsym(h, CB_CUDA_ENTRY);
            if (!mod_open)
                snprintf(mod_why, sizeof mod_why, "%s has no entry point %s", CUDA_MODULE,
                         CB_CUDA_ENTRY);
        } else if (why[0]) {
            snprintf(mod_why, sizeof mod_why, "cannot load %s: %s", CUDA_MODULE, why);
        } else {
            snprintf(
                mod_why, sizeof mod_why,
                "this build has no CUDA backend (%s not found next to the program, in %s, or through "
                "$CB_CUDA_MODULE); build it where nvcc is installed (make CUDA=1)",
                CUDA_MODULE, CB_LIBDIR);
        }
    }
    cb_cuda_open_fn f = mod_open;
    pthread_mutex_unlock(&mod_mu);
    return f;
}

/* Does this machine have the NVIDIA driver loaded?  Cheap: no library is
 * loaded to answer. */
static int nvidia_driver_present(void)
{
    return access("/dev/nvidiactl", F_OK) == 0 || access("/proc/driver/nvidia/version", F_OK) == 0;
}

static cb_status open_cuda(cb_backend **out, int dev, cb_error *err)
{
    char msg[512] = "";
    cb_cuda_open_fn fn = cuda_module();
    if (!fn)
        return cb_error_set(err, CB_ERR_DEVICE, "cuda: %s", mod_why);
    int st = fn(out, CB_CUDA_ABI, dev, msg, sizeof msg);
    if (st != CB_OK)
        return cb_error_set(err, st == CB_ERR_NOMEM ? CB_ERR_NOMEM : CB_ERR_DEVICE, "cuda:%d: %s",
                            dev, msg[0] ? msg : "cannot start the CUDA backend");
    return CB_OK;
}

static cb_status open_cpu(cb_backend **out, int n_threads, cb_error *err)
{
    const char *no_blas = cb_blas_load();
    if (no_blas)
        return cb_error_set(err, CB_ERR_DEVICE, "cpu: %s", no_blas);
    *out = cb_backend_cpu_new(n_threads);
    return *out ? CB_OK : cb_error_set(err, CB_ERR_NOMEM, "cpu: cannot start the CPU backend");
}

/* $CB_BACKEND_FAIL_AT=N: the tests' fault injection (cb_backend_fail_at);
 * $CB_BACKEND_PROFILE=1: the operation profile (cb_backend_profile). */
static cb_status wrap_ops(cb_backend **out, cb_error *err)
{
    const char *env = getenv("CB_BACKEND_FAIL_AT"), *prof = getenv("CB_BACKEND_PROFILE");
    char *end;
    long n;
    cb_status st = CB_OK;
    if (prof && strcmp(prof, "1") == 0 && (st = cb_backend_profile(*out)) != CB_OK) {
        cb_error_set(err, st, "CB_BACKEND_PROFILE: %s", cb_strerror(st));
        (*out)->ops->free(*out);
        *out = NULL;
        return st;
    }
    if (!env || !*env)
        return CB_OK;
    n = strtol(env, &end, 10);
    if (*end || n < 1)
        st = cb_error_set(err, CB_ERR_INVALID, "CB_BACKEND_FAIL_AT=%.32s: expected a count >= 1",
                          env);
    else if ((st = cb_backend_fail_at(*out, n)) != CB_OK)
        cb_error_set(err, st, "CB_BACKEND_FAIL_AT: %s", cb_strerror(st));
    if (st != CB_OK) {
        (*out)->ops->free(*out);
        *out = NULL;
    }
    return st;
}

static cb_status open_device(cb_backend **out, const char *device, int n_threads, cb_error *err)
{
    if (!device || !*device)
        device = "cpu";
    if (strcmp(device, "auto") == 0) {
        if (nvidia_driver_present() && open_cuda(out, 0, NULL) == CB_OK)
            return CB_OK;
        return open_cpu(out, n_threads, err);
    }
    if (strcmp(device, "cpu") == 0)
        return open_cpu(out, n_threads, err);
    if (strncmp(device, "cuda", 4) == 0 && (device[4] == 0 || device[4] == ':')) {
        long dev = 0;
        if (device[4] == ':') {
            char *end;
            dev = strtol(device + 5, &end, 10);
            if (end == device + 5 || *end || dev < 0 || dev > 255)
                return cb_error_set(err, CB_ERR_INVALID,
                                    "device '%s': expected cuda:N with N a device number", device);
        }
        return open_cuda(out, (int)dev, err);
    }
    return cb_error_set(err, CB_ERR_INVALID,
                        "device '%.64s' is not known (expected cpu, cuda or cuda:N)", device);
}

cb_status cb_backend_open(cb_backend **out, const char *device, int n_threads, cb_error *err)
{
    *out = NULL;
    cb_status st = open_device(out, device, n_threads, err);
    return st == CB_OK ? wrap_ops(out, err) : st;
}
