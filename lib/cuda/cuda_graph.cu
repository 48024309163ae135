/* cuda_graph.cu - graphs (backend.h's graph_begin and graph_end), behind
 * CB_CUDA_GRAPH=1 until a GPU run has checked them: a decode
 * step's few hundred launches recorded once per step (stream capture on
 * the thread's stream) and queued as one graph, the executable graph of
 * the step before updated in place (cudaGraphExecUpdate) rather than made
 * anew, so that the host's cost per step is the recording and one launch.
 *
 * What a recording may not hold, it never reaches: while the thread
 * records (cu_rec), stage() and upload_on() send host arrays through the
 * recording's own page-locked arena (a copy node reads it when the graph
 * runs; the next recording rewrites it only after that run, an event
 * recorded after each launch), and anything that would allocate, free,
 * make a cuBLAS handle or send a key-bias row refuses (rec_refuse).  A
 * refusal, or any CUDA error while recording, fails the recording, not
 * the backend: the table's entries then do nothing until graph_end, which
 * ends the capture, drops it and returns 0, and the caller queues the
 * step again as usual (the scratch that had to grow then grows).  After
 * GR_TRIES failures in a row the thread records no more, and says so on
 * stderr once.  Nothing a recording that does not run did is left
 * behind: the arena is its device-side state, and rec_undo puts back the
 * host's (the key bias, the products' amax slot). */
#include "cuda_impl.cuh"

thread_local int cu_rec;

/* why the recording failed (the first reason), for the message */
static thread_local char rec_why[200];

void rec_refuse(const char *what)
{
    cu_fail(CB_ERR_DEVICE, 0, what, __FILE__, __LINE__, "not done while recording a graph");
}

void rec_broken(const char *why)
{
    if (cu_rec != REC_BROKEN)
        snprintf(rec_why, sizeof rec_why, "%s", why);
    cu_rec = REC_BROKEN;
}

/* n bytes of the arena, aligned for any element type */
static size_t arena_take(tctx *t, size_t n)
{
    size_t off = (t->rec_off + 255) & ~(size_t)255;
    if (off + n > t->arena.cap)
        rec_refuse("stage (the recording's arena is full)");
    t->rec_off = off + n;
    return off;
}

const void *rec_stage(tctx *t, const void *h, size_t bytes)
{
    char *host = (char *)t->arena.host, *dev = (char *)t->arena.dev;
    if (bytes == 0)
        return dev;
    /* a decode step's layers stage the same positions and RoPE table
     * again and again: one copy node for each of them */
    for (int i = 0; i < t->rec_n; i++)
        if (t->rec_seen[i].len == bytes && memcmp(host + t->rec_seen[i].off, h, bytes) == 0)
            return dev + t->rec_seen[i].off;
    size_t off = arena_take(t, bytes);
    memcpy(host + off, h, bytes);
    CK(cudaMemcpyAsync(dev + off, host + off, bytes, cudaMemcpyHostToDevice, t->s));
    if (t->rec_n < REC_SEEN)
        t->rec_seen[t->rec_n++] = {off, bytes};
    return dev + off;
}

void rec_upload(tctx *t, void *dst, const void *src, size_t bytes)
{
    if (bytes == 0)
        return;
    size_t off = arena_take(t, bytes);
    memcpy((char *)t->arena.host + off, src, bytes);
    CK(cudaMemcpyAsync(dst, (char *)t->arena.host + off, bytes, cudaMemcpyHostToDevice, t->s));
}

/* a failed recording (or graph): counted, and past GR_TRIES in a row the
 * thread's graphs are off */
static void rec_failed(tctx *t, const char *why)
{
    if (++t->gr_fails < GR_TRIES || t->gr_off)
        return;
    t->gr_off = 1;
    fprintf(stderr, "cacheblend: cuda: CB_CUDA_GRAPH=1: graphs off for this thread after %d failed recordings "
                    "in a row (the last: %s); its steps are queued as usual\n",
            GR_TRIES, why);
}

/* The host's side as if nothing had been recorded, for a recording whose
 * work never runs (dropped, failed, or its graph not made or launched):
 * a key bias set while recording stays set (a failed recording skipped
 * the call that would have cleared it, and a dropped one may never have
 * made it; the step queued again sets it where it is due, and no other
 * attention may take it), and the products' amax slot (cuda_mm.cu) goes
 * back to the one the device still has zeroed. */
static void rec_undo(tctx *t)
{
    t->kb_n = 0;
    t->amax_at = t->rec_amax_at;
}

/* The arena (host and device) and its event, made on the first
 * recording; false when out of memory (the error cleared: graphs are an
 * option, not worth a fault) */
static bool arena_make(tctx *t)
{
    if (!t->arena.ev)
        CK(cudaEventCreateWithFlags(&t->arena.ev, cudaEventDisableTiming));
    if (t->arena.host)
        return true;
    cudaError_t e = cudaHostAlloc(&t->arena.host, ARENA_BYTES, cudaHostAllocDefault);
    if (e == cudaSuccess && (e = cudaMallocAsync(&t->arena.dev, ARENA_BYTES, t->s)) != cudaSuccess) {
        cudaFreeHost(t->arena.host);
        t->arena.host = NULL;
    }
    if (e == cudaErrorMemoryAllocation) {
        cudaGetLastError();
        return false;
    }
    CK(e);
    t->arena.cap = ARENA_BYTES;
    return true;
}

int cu_graph_begin(cb_backend *b, int key)
{
    if (cb_backend_status(b) != CB_OK || cu_rec)
        return 0;
    try {
        tctx *t = T(b, "graph_begin");
        if (t->gr_off)
            return 0;
        if (!arena_make(t)) {
            t->gr_off = 1; /* (no memory for the arena: steps queued as usual) */
            return 0;
        }
        cu_blas(t); /* (a handle is not made while recording) */
        CK(cudaEventSynchronize(t->arena.ev)); /* the last graph has read the arena */
        t->rec_off = 0, t->rec_n = 0, t->rec_key = key, t->rec_amax_at = t->amax_at;
        cudaError_t e = cudaStreamBeginCapture(t->s, cudaStreamCaptureModeThreadLocal);
        if (e != cudaSuccess) {
            cudaGetLastError();
            rec_failed(t, cudaGetErrorString(e));
            return 0;
        }
        cu_rec = REC_ON;
        rec_why[0] = 0;
        return 1;
    } catch (const cu_fault &f) {
        cb_backend_fail(b, f.st, "cuda:%d: %s", CTX(b)->dev, f.msg);
    }
    return 0;
}

/* the thread's executable graph for key: the one it holds, or the least
 * recently used slot (emptied) */
static gexec *gexec_for(tctx *t, int key)
{
    gexec *lru = &t->gx[0];
    for (int i = 0; i < N_GX; i++) {
        if (t->gx[i].ex && t->gx[i].key == key)
            return &t->gx[i];
        if (t->gx[i].used < lru->used)
            lru = &t->gx[i];
    }
    if (lru->ex)
        cudaGraphExecDestroy(lru->ex);
    lru->ex = NULL;
    lru->key = key;
    return lru;
}

/* Graph g as x's executable: x's updated in place when its shape allows
 * (the same nodes, new parameters: the step's positions, its caches'
 * pointers, its attention's split), else made anew.  A CUDA error (not
 * sticky: a graph the device cannot make) is returned, and x left empty. */
static cudaError_t gexec_set(gexec *x, cudaGraph_t g)
{
    if (x->ex) {
        cudaGraphExecUpdateResultInfo info;
        if (cudaGraphExecUpdate(x->ex, g, &info) == cudaSuccess)
            return cudaSuccess;
        cudaGetLastError();
        cudaGraphExecDestroy(x->ex);
        x->ex = NULL;
    }
    cudaError_t e = cudaGraphInstantiate(&x->ex, g, 0);
    if (e != cudaSuccess) {
        cudaGetLastError();
        x->ex = NULL;
    }
    return e;
}

int cu_graph_end(cb_backend *b, int run)
{
    if (!cu_rec)
        return 0;
    tctx *t = (tctx *)pthread_getspecific(CTX(b)->key); /* (graph_begin made it) */
    cudaGraph_t g = NULL;
    cudaError_t e = cudaStreamEndCapture(t->s, &g);
    bool broken = cu_rec == REC_BROKEN || e != cudaSuccess || !g;
    cu_rec = REC_OFF;
    if (broken || !run)
        rec_undo(t);
    if (broken) {
        /* the error that broke it, or the capture's own, is not sticky:
         * cleared, lest the step queued again meet it at its first check */
        cudaGetLastError();
        rec_failed(t, rec_why[0] ? rec_why : cudaGetErrorString(e));
    }
    if (broken || !run || cb_backend_status(b) != CB_OK) {
        if (g)
            cudaGraphDestroy(g);
        return 0;
    }
    gexec *x = gexec_for(t, t->rec_key);
    if ((e = gexec_set(x, g)) != cudaSuccess) {
        cudaGraphDestroy(g);
        rec_undo(t);
        rec_failed(t, cudaGetErrorString(e));
        return 0;
    }
    cudaGraphDestroy(g); /* (the executable keeps what it needs) */
    x->used = ++t->gx_clock;
    try {
        T(b, "graph_end");
        if ((e = cudaGraphLaunch(x->ex, t->s)) != cudaSuccess) {
            cudaGetLastError();
            if (cudaPeekAtLastError() != cudaSuccess) /* sticky: the device's fault */
                CK(e);
            cudaGraphExecDestroy(x->ex); /* (not launched: the step is queued again) */
            x->ex = NULL;
            rec_undo(t);
            rec_failed(t, cudaGetErrorString(e));
            return 0;
        }
        CK(cudaEventRecord(t->arena.ev, t->s));
        t->gr_fails = 0;
        return 1;
    } catch (const cu_fault &f) {
        cb_backend_fail(b, f.st, "cuda:%d: %s", CTX(b)->dev, f.msg);
    }
    return 0; /* (the fault says the step's work is lost: queued again, it does nothing) */
}

/* A thread that ends while it records (outside backend.h's contract):
 * the capture ended and dropped, so that its context, which the next
 * thread takes with its stream, is not left capturing */
void rec_abandon(tctx *t)
{
    if (!cu_rec)
        return;
    cudaGraph_t g = NULL;
    cudaStreamEndCapture(t->s, &g);
    if (g)
        cudaGraphDestroy(g);
    cudaGetLastError();
    cu_rec = REC_OFF;
    rec_undo(t);
}

void rec_destroy(tctx *t)
{
    for (int i = 0; i < N_GX; i++)
        if (t->gx[i].ex)
            cudaGraphExecDestroy(t->gx[i].ex);
    cudaFreeHost(t->arena.host);
    cudaFree(t->arena.dev);
    if (t->arena.ev)
        cudaEventDestroy(t->arena.ev);
}
