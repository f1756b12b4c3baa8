/* Minimal SVG line charts written as plain text: axes, ticks, labels, one
 * polyline (or markers) per series and a legend. Linear or log10 axes. */
#include "sim/sim.h"

#include <errno.h>
#include <math.h>
#include <string.h>

#define W 720.0
#define H 460.0
#define LEFT 80.0
#define RIGHT 30.0
#define TOP 40.0
#define BOTTOM 60.0
#define MAX_TICKS 32

static const char *palette[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"};

typedef struct axis {
    double lo, hi; /* data range, in log10 when log */
    int log;
    double px0, px1; /* pixel positions of lo and hi */
} axis;

static double to_px(const axis *a, double v) {
    double u = a->log ? log10(v) : v;
    return a->px0 + (u - a->lo) / (a->hi - a->lo) * (a->px1 - a->px0);
}

/* Extends [lo, hi] so it is not empty and starts at a round number. */
static void fit_range(axis *a, double lo, double hi) {
    if (a->log) {
        lo = floor(log10(lo));
        hi = ceil(log10(hi));
        if (hi <= lo) hi = lo + 1;
    } else {
        if (lo > 0 && lo < 0.5 * hi) lo = 0; /* show the origin when it is close */
        if (hi <= lo) {
            double pad = lo != 0 ? fabs(lo) * 0.1 : 1.0;
            lo -= pad;
            hi += pad;
        }
        double span = hi - lo;
        lo -= 0.02 * span * (lo != 0);
        hi += 0.05 * span;
    }
    a->lo = lo;
    a->hi = hi;
}

/* Tick values: 1-2-5 steps aiming at ~6 ticks (linear), decades (log). */
static int ticks(const axis *a, double *t) {
    int n = 0;
    if (a->log) {
        int decades = (int)(a->hi - a->lo);
        static const double sub[] = {1, 2, 5};
        for (int d = (int)a->lo; d <= (int)a->hi && n < MAX_TICKS; d++)
            for (int i = 0; i < (decades <= 3 ? 3 : 1) && n < MAX_TICKS; i++) {
                double v = sub[i] * pow(10, d);
                if (log10(v) <= a->hi + 1e-9) t[n++] = v;
            }
        return n;
    }
    double raw = (a->hi - a->lo) / 6, mag = pow(10, floor(log10(raw))), step = mag;
    if (raw / mag > 5) step = 10 * mag;
    else if (raw / mag > 2) step = 5 * mag;
    else if (raw / mag > 1) step = 2 * mag;
    for (double v = ceil(a->lo / step) * step; v <= a->hi + 1e-9 * step && n < MAX_TICKS; v += step)
        t[n++] = fabs(v) < 1e-12 * step ? 0 : v;
    return n;
}

static void svg_escaped(FILE *f, const char *s) {
    for (; s && *s; s++) {
        if (*s == '<') fputs("&lt;", f);
        else if (*s == '>') fputs("&gt;", f);
        else if (*s == '&') fputs("&amp;", f);
        else fputc(*s, f);
    }
}

static int axis_usable(const axis *a, double v) { return isfinite(v) && (!a->log || v > 0); }

static int data_range(const moex_svg_chart *c, axis *x, axis *y, moex_error *err) {
    double xlo = INFINITY, xhi = -INFINITY, ylo = INFINITY, yhi = -INFINITY;
    for (int s = 0; s < c->n_series; s++)
        for (int i = 0; i < c->series[s].n; i++) {
            double xv = c->series[s].x[i], yv = c->series[s].y[i];
            if (!axis_usable(x, xv) || !axis_usable(y, yv)) continue;
            xlo = fmin(xlo, xv), xhi = fmax(xhi, xv), ylo = fmin(ylo, yv), yhi = fmax(yhi, yv);
        }
    if (!(xlo <= xhi)) return moex_fail(err, "svg chart '%s' has no plottable points", c->title ? c->title : "");
    fit_range(x, xlo, xhi);
    fit_range(y, ylo, yhi);
    return 0;
}

static void draw_axes(FILE *f, const moex_svg_chart *c, const axis *x, const axis *y) {
    double t[MAX_TICKS];
    fprintf(f, "<rect x='%g' y='%g' width='%g' height='%g' fill='none' stroke='#000'/>\n", LEFT, TOP,
            W - LEFT - RIGHT, H - TOP - BOTTOM);
    int n = ticks(x, t);
    for (int i = 0; i < n; i++) {
        double px = to_px(x, t[i]);
        fprintf(f, "<line x1='%.1f' y1='%g' x2='%.1f' y2='%g' stroke='#ddd'/>\n", px, TOP, px, H - BOTTOM);
        fprintf(f, "<text x='%.1f' y='%g' text-anchor='middle'>%g</text>\n", px, H - BOTTOM + 18, t[i]);
    }
    n = ticks(y, t);
    for (int i = 0; i < n; i++) {
        double py = to_px(y, t[i]);
        fprintf(f, "<line x1='%g' y1='%.1f' x2='%g' y2='%.1f' stroke='#ddd'/>\n", LEFT, py, W - RIGHT, py);
        fprintf(f, "<text x='%g' y='%.1f' text-anchor='end'>%g</text>\n", LEFT - 6, py + 4, t[i]);
    }
    fprintf(f, "<text x='%g' y='%g' text-anchor='middle' font-size='16'>", W / 2, TOP - 14);
    svg_escaped(f, c->title);
    fprintf(f, "</text>\n<text x='%g' y='%g' text-anchor='middle'>", (LEFT + W - RIGHT) / 2, H - 16);
    svg_escaped(f, c->xlabel);
    fprintf(f, "</text>\n<text transform='translate(18,%g) rotate(-90)' text-anchor='middle'>", (TOP + H - BOTTOM) / 2);
    svg_escaped(f, c->ylabel);
    fputs("</text>\n", f);
}

static void draw_series(FILE *f, const moex_svg_series *s, const char *color, const axis *x, const axis *y) {
    if (s->markers_only) {
        for (int i = 0; i < s->n; i++)
            if (axis_usable(x, s->x[i]) && axis_usable(y, s->y[i]))
                fprintf(f, "<circle cx='%.1f' cy='%.1f' r='4' fill='none' stroke='%s' stroke-width='2'/>\n",
                        to_px(x, s->x[i]), to_px(y, s->y[i]), color);
        return;
    }
    fprintf(f, "<polyline fill='none' stroke='%s' stroke-width='2' points='", color);
    for (int i = 0; i < s->n; i++)
        if (axis_usable(x, s->x[i]) && axis_usable(y, s->y[i])) fprintf(f, "%.1f,%.1f ", to_px(x, s->x[i]), to_px(y, s->y[i]));
    fputs("'/>\n", f);
}

static void draw_legend(FILE *f, const moex_svg_chart *c) {
    for (int s = 0; s < c->n_series; s++) {
        const char *color = palette[s % (int)(sizeof palette / sizeof *palette)];
        double ly = TOP + 16 + 18 * s, lx = W - RIGHT - 190;
        if (c->series[s].markers_only)
            fprintf(f, "<circle cx='%g' cy='%g' r='4' fill='none' stroke='%s' stroke-width='2'/>\n", lx + 12, ly - 4, color);
        else
            fprintf(f, "<line x1='%g' y1='%g' x2='%g' y2='%g' stroke='%s' stroke-width='2'/>\n", lx, ly - 4, lx + 24, ly - 4, color);
        fprintf(f, "<text x='%g' y='%g'>", lx + 30, ly);
        svg_escaped(f, c->series[s].label);
        fputs("</text>\n", f);
    }
}

int moex_svg_write(FILE *f, const moex_svg_chart *c, moex_error *err) {
    axis x = {.log = c->log_x, .px0 = LEFT, .px1 = W - RIGHT};
    axis y = {.log = c->log_y, .px0 = H - BOTTOM, .px1 = TOP};
    if (data_range(c, &x, &y, err)) return -1;
    fprintf(f, "<svg xmlns='http://www.w3.org/2000/svg' width='%g' height='%g' viewBox='0 0 %g %g' "
               "font-family='sans-serif' font-size='12'>\n<rect width='100%%' height='100%%' fill='#fff'/>\n",
            W, H, W, H);
    draw_axes(f, c, &x, &y);
    for (int s = 0; s < c->n_series; s++)
        draw_series(f, &c->series[s], palette[s % (int)(sizeof palette / sizeof *palette)], &x, &y);
    draw_legend(f, c);
    fputs("</svg>\n", f);
    if (ferror(f)) return moex_fail(err, "write error while writing the svg chart");
    return 0;
}

int moex_svg_save(const char *path, const moex_svg_chart *c, moex_error *err) {
    FILE *f = fopen(path, "w");
    if (!f) return moex_fail(err, "cannot create %s: %s", path, strerror(errno));
    int rc = moex_svg_write(f, c, err);
    if (fclose(f) && !rc) rc = moex_fail(err, "cannot write %s: %s", path, strerror(errno));
    return rc;
}
