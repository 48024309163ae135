/* marks.c - timing on the model's backend: marks recorded on the work a
 * thread queues (a device's events, which keep the time the work before
 * them was done; the host's clock where operations are done when they
 * return), and spans, pairs of them summed.  On a device the host's clock
 * sees when work was queued, not when it ran: blending times its waits
 * for the KV loader with spans (blend.c, blend_wait). */
#include "model_impl.h"

#include <math.h>
#include <stdlib.h>

struct cb_mark {
    void *ev; /* the backend's mark */
    double t; /* else the host's clock when recorded (NaN: never) */
};

int cb_model_marks_on_device(const cb_model *m)
{
    return m->be->ops->mark_new && m->be->ops->mark_ms && m->be->ops->event_record;
}

cb_mark *cb_model_mark_new(const cb_model *m)
{
    cb_mark *mk = calloc(1, sizeof *mk);
    if (!mk)
        return NULL;
    mk->t = NAN;
    if (cb_model_marks_on_device(m) && !(mk->ev = m->be->ops->mark_new(m->be))) {
        free(mk);
        return NULL;
    }
    return mk;
}

void cb_model_mark_free(const cb_model *m, cb_mark *mk)
{
    if (mk && mk->ev)
        m->be->ops->event_free(m->be, mk->ev);
    free(mk);
}

void cb_model_mark_record(const cb_model *m, cb_mark *mk)
{
    if (mk->ev)
        m->be->ops->event_record(m->be, mk->ev);
    else
        mk->t = cb_now_ms();
}

double cb_model_mark_ms(const cb_model *m, const cb_mark *a, const cb_mark *z)
{
    if (!a->ev != !z->ev)
        return -1;
    if (!a->ev)
        return isnan(a->t) || isnan(z->t) ? -1 : z->t - a->t;
    double ms = m->be->ops->mark_ms(m->be, a->ev, z->ev);
    return cb_backend_status(m->be) == CB_OK ? ms : -1;
}

struct cb_spans {
    const cb_model *m;
    cb_mark **mk; /* [2 n]: each span's begin and end */
    int32_t n, cap;
    int failed; /* a mark could not be made: the sum is unknown */
};

cb_spans *cb_spans_new(const cb_model *m)
{
    cb_spans *s = calloc(1, sizeof *s);
    if (s)
        s->m = m;
    return s;
}

void cb_spans_free(cb_spans *s)
{
    if (!s)
        return;
    for (int32_t i = 0; i < 2 * s->n; i++)
        cb_model_mark_free(s->m, s->mk[i]);
    free(s->mk);
    free(s);
}

void cb_spans_begin(cb_spans *s)
{
    if (!s || s->failed)
        return;
    if (s->n == s->cap) {
        int32_t cap = s->cap ? 2 * s->cap : 64;
        cb_mark **mk = realloc(s->mk, sizeof *mk * 2 * (size_t)cap);
        if (!mk) {
            s->failed = 1;
            return;
        }
        s->mk = mk, s->cap = cap;
    }
    cb_mark *a = cb_model_mark_new(s->m), *z = a ? cb_model_mark_new(s->m) : NULL;
    if (!z) {
        cb_model_mark_free(s->m, a);
        s->failed = 1;
        return;
    }
    s->mk[2 * s->n] = a, s->mk[2 * s->n + 1] = z;
    s->n++;
    cb_model_mark_record(s->m, a);
}

void cb_spans_end(cb_spans *s)
{
    if (s && !s->failed && s->n > 0)
        cb_model_mark_record(s->m, s->mk[2 * s->n - 1]);
}

double cb_spans_ms(const cb_spans *s)
{
    double sum = 0;
    if (!s || s->failed)
        return -1;
    for (int32_t i = 0; i < s->n; i++) {
        double ms = cb_model_mark_ms(s->m, s->mk[2 * i], s->mk[2 * i + 1]);
        if (ms < 0)
            return -1;
        sum += ms;
    }
    return sum;
}
