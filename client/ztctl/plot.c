/* ztctl plot: a job's loss curve as text, from its show reply's losses: one column per run of
 * steps (their mean), fitting 80 columns; its held-out evaluations' losses (data.eval, the
 * reply's evals) as a second curve in the same frame. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client/ztctl/ztctl.h"

#define PLOT_COLS 70   /* with the 8-column axis labels and the frame: 80 */
#define PLOT_ROWS_DEFAULT 16

/* The curve of losses (n of them, step i + 1 each) in rows x cols cells: '*' marks a column's
 * mean; 'o' an evaluation's loss (ne of them: after step estep[k], eloss[k]) in the column of
 * its step (the last of a column's when several fall in it); rows of the range's top and
 * bottom are labelled. */
static void draw(FILE *f, const double *loss, size_t n, const long long *estep,
                 const double *eloss, size_t ne, int rows) {
  int cols = n < PLOT_COLS ? (int)n : PLOT_COLS;
  double mean[PLOT_COLS], ev[PLOT_COLS], lo = INFINITY, hi = -INFINITY;
  for (int c = 0; c < cols; c++) ev[c] = NAN;
  for (size_t k = 0; k < ne; k++) {
    if (estep[k] < 1 || (size_t)estep[k] > n || !isfinite(eloss[k])) continue;
    /* the column whose run of steps holds the step */
    int c = (int)(((size_t)estep[k] - 1) * (size_t)cols / n);
    ev[c] = eloss[k];
    if (eloss[k] < lo) lo = eloss[k];
    if (eloss[k] > hi) hi = eloss[k];
  }
  for (int c = 0; c < cols; c++) {
    size_t a = n * (size_t)c / (size_t)cols, b = n * (size_t)(c + 1) / (size_t)cols, k = 0;
    double sum = 0;
    for (size_t i = a; i < b; i++)
      if (isfinite(loss[i])) sum += loss[i], k++;
    mean[c] = k ? sum / (double)k : NAN;
    if (k && mean[c] < lo) lo = mean[c];
    if (k && mean[c] > hi) hi = mean[c];
  }
  if (!(hi >= lo)) {
    fprintf(f, "no finite loss to plot\n");
    return;
  }
  if (hi == lo) hi = lo + 1;
  for (int r = 0; r < rows; r++) {
    /* row r covers the values nearest top - r * (hi - lo) / (rows - 1) */
    char line[PLOT_COLS + 1];
    for (int c = 0; c < cols; c++) {
      int at = isfinite(mean[c]) ? (int)lround((hi - mean[c]) / (hi - lo) * (rows - 1)) : -1;
      int eat = isfinite(ev[c]) ? (int)lround((hi - ev[c]) / (hi - lo) * (rows - 1)) : -1;
      line[c] = eat == r ? 'o' : at == r ? '*' : ' ';
    }
    int len = cols;
    while (len > 0 && line[len - 1] == ' ') len--;
    line[len] = '\0';
    if (r == 0 || r == rows - 1)
      fprintf(f, "%8.4g |%s\n", r == 0 ? hi : lo, line);
    else
      fprintf(f, "%8s |%s\n", "", line);
  }
  char axis[PLOT_COLS + 1];
  memset(axis, '-', (size_t)cols);
  axis[cols] = '\0';
  fprintf(f, "%8s +%s\n", "", axis);
  char last[24];
  int w = snprintf(last, sizeof last, "%zu", n);
  fprintf(f, "%8s  1%*s\n", "", cols - 1 > w ? cols - 1 : w, last);
}

int ztctl_cmd_plot(const ztctl_opts *o, int argc, char **argv) {
  const char *job = NULL;
  int rows = PLOT_ROWS_DEFAULT;
  for (int i = 0; i < argc; i++) {
    if (!strcmp(argv[i], "--height") && i + 1 < argc) {
      char *end;
      long v = strtol(argv[++i], &end, 10);
      if (*end || v < 4 || v > 100) return ztctl_usage_error("plot", "--height wants 4 to 100 rows");
      rows = (int)v;
    } else if (argv[i][0] == '-' && argv[i][1]) {
      return ztctl_usage_error("plot", "unknown option '%s'", argv[i]);
    } else if (job) {
      return ztctl_usage_error("plot", "plot takes 1 argument");
    } else {
      job = argv[i];
    }
  }
  if (!job) return ztctl_usage_error("plot", "plot takes 1 argument, not 0");
  int rc = ZTCTL_FAILED;
  char *json = NULL;
  json_t *j = NULL;
  double *loss = NULL, *eloss = NULL;
  long long *estep = NULL;
  zt_client *c = ztctl_connect(o);
  if (!c) goto out;
  if (zt_client_show(c, job, &json) < 0) {
    rc = ztctl_fail(c);
    goto out;
  }
  j = json_loads(json, 0, NULL);
  const json_t *losses = json_object_get(j, "losses");
  size_t n = json_array_size(losses);
  if (!n) {
    rc = ztctl_fail_msg("ENODATA", "%s has no steps yet", job);
    goto out;
  }
  if (!(loss = malloc(n * sizeof *loss))) {
    rc = ztctl_fail_msg("ENOMEM", "out of memory");
    goto out;
  }
  for (size_t i = 0; i < n; i++) {
    const json_t *v = json_array_get(losses, i);
    loss[i] = json_is_number(v) ? json_number_value(v) : NAN;
  }
  const json_t *evals = json_object_get(j, "evals");
  size_t ne = json_array_size(evals);
  if (ne && (!(eloss = malloc(ne * sizeof *eloss)) || !(estep = malloc(ne * sizeof *estep)))) {
    rc = ztctl_fail_msg("ENOMEM", "out of memory");
    goto out;
  }
  for (size_t k = 0; k < ne; k++) {
    const json_t *e = json_array_get(evals, k);
    estep[k] = (long long)json_integer_value(json_array_get(e, 0));
    eloss[k] = json_is_number(json_array_get(e, 1)) ? json_number_value(json_array_get(e, 1))
                                                     : NAN;
  }
  const char *name = json_string_value(json_object_get(j, "name"));
  printf("%s%s%s: loss over %zu step%s (%s)", job, name && name[0] ? " " : "", name ? name : "",
         n, n == 1 ? "" : "s", json_string_value(json_object_get(j, "state")) ?: "?");
  if (ne) printf("; o: eval loss of %zu evaluation%s", ne, ne == 1 ? "" : "s");
  printf("\n");
  draw(stdout, loss, n, estep, eloss, ne, rows);
  rc = ZTCTL_OK;
out:
  free(loss);
  free(eloss);
  free(estep);
  json_decref(j);
  free(json);
  zt_client_close(c);
  return rc;
}
