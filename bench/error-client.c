/*
 * Times a statement that is expected to fail, which pgbench 15 cannot do: a
 * pgbench client stops at its first error. Used for the IK409 leg, where
 * every call must be refused at once because another session holds the key.
 *
 *   error-client CONNINFO CLIENTS SECONDS SQLSTATE SQL
 *
 * Forks CLIENTS processes; each connects, prepares SQL once and runs it in a
 * loop for SECONDS, timing each call from send to reply as pgbench does.
 * Prints one line:
 *
 *   calls=N tps=T p50_ms=A p99_ms=B max_ms=C unexpected=U
 *
 * and exits non-zero if any call ended other than with SQLSTATE (a success
 * or another error), which is printed once on stderr.
 */
#include <libpq-fe.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* Latencies each client can record; the rest are counted but not timed. */
#define MAX_SAMPLES_PER_CLIENT 2000000

struct client_result {
  long calls;
  long unexpected;
  double seconds;
  long samples;
};

static double now_seconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void run_client(const char *conninfo, double seconds,
                       const char *sqlstate, const char *sql,
                       struct client_result *result, float *latencies_ms) {
  PGconn *conn = PQconnectdb(conninfo);
  if (PQstatus(conn) != CONNECTION_OK) {
    fprintf(stderr, "error-client: %s", PQerrorMessage(conn));
    exit(1);
  }
  PGresult *prepared = PQprepare(conn, "call", sql, 0, NULL);
  if (PQresultStatus(prepared) != PGRES_COMMAND_OK) {
    fprintf(stderr, "error-client: %s", PQerrorMessage(conn));
    exit(1);
  }
  PQclear(prepared);

  double start = now_seconds();
  double deadline = start + seconds;
  double finished = start;
  while (finished < deadline) {
    double sent = now_seconds();
    PGresult *reply = PQexecPrepared(conn, "call", 0, NULL, NULL, NULL, 0);
    finished = now_seconds();
    const char *state = PQresultErrorField(reply, PG_DIAG_SQLSTATE);
    if (PQresultStatus(reply) != PGRES_FATAL_ERROR || state == NULL ||
        strcmp(state, sqlstate) != 0) {
      if (result->unexpected++ == 0)
        fprintf(stderr, "error-client: expected SQLSTATE %s, got %s: %s",
                sqlstate, state ? state : "success",
                PQresultErrorMessage(reply));
    }
    PQclear(reply);
    if (result->samples < MAX_SAMPLES_PER_CLIENT)
      latencies_ms[result->samples++] = (float)((finished - sent) * 1000.0);
    result->calls++;
  }
  result->seconds = finished - start;
  PQfinish(conn);
}

static int compare_floats(const void *a, const void *b) {
  float x = *(const float *)a;
  float y = *(const float *)b;
  return (x > y) - (x < y);
}

static float percentile(const float *sorted, long count, double fraction) {
  if (count == 0)
    return 0;
  long index = (long)(fraction * count);
  if (index >= count)
    index = count - 1;
  return sorted[index];
}

int main(int argc, char **argv) {
  if (argc != 6) {
    fprintf(stderr,
            "usage: error-client CONNINFO CLIENTS SECONDS SQLSTATE SQL\n");
    return 2;
  }
  const char *conninfo = argv[1];
  int clients = atoi(argv[2]);
  double seconds = atof(argv[3]);
  const char *sqlstate = argv[4];
  const char *sql = argv[5];
  if (clients < 1 || seconds <= 0) {
    fprintf(stderr, "error-client: CLIENTS and SECONDS must be positive\n");
    return 2;
  }

  /* Shared with the children, so they report without pipes or files. */
  size_t results_size = sizeof(struct client_result) * clients;
  size_t samples_size = sizeof(float) * MAX_SAMPLES_PER_CLIENT * clients;
  struct client_result *results =
      mmap(NULL, results_size, PROT_READ | PROT_WRITE,
           MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  float *samples = mmap(NULL, samples_size, PROT_READ | PROT_WRITE,
                        MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (results == MAP_FAILED || samples == MAP_FAILED) {
    perror("error-client: mmap");
    return 1;
  }
  memset(results, 0, results_size);

  for (int i = 0; i < clients; i++) {
    pid_t pid = fork();
    if (pid < 0) {
      perror("error-client: fork");
      return 1;
    }
    if (pid == 0) {
      run_client(conninfo, seconds, sqlstate, sql, &results[i],
                 samples + (size_t)i * MAX_SAMPLES_PER_CLIENT);
      _exit(0);
    }
  }
  int failed_clients = 0;
  for (int i = 0; i < clients; i++) {
    int status;
    wait(&status);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
      failed_clients++;
  }
  if (failed_clients > 0)
    return 1;

  long calls = 0, unexpected = 0, timed = 0;
  double tps = 0;
  for (int i = 0; i < clients; i++) {
    calls += results[i].calls;
    unexpected += results[i].unexpected;
    if (results[i].seconds > 0)
      tps += results[i].calls / results[i].seconds;
    /* Pack each client's samples after the previous client's. */
    memmove(samples + timed, samples + (size_t)i * MAX_SAMPLES_PER_CLIENT,
            sizeof(float) * results[i].samples);
    timed += results[i].samples;
  }
  qsort(samples, timed, sizeof(float), compare_floats);
  printf("calls=%ld tps=%.1f p50_ms=%.3f p99_ms=%.3f max_ms=%.3f "
         "unexpected=%ld\n",
         calls, tps, percentile(samples, timed, 0.50),
         percentile(samples, timed, 0.99), percentile(samples, timed, 1.0),
         unexpected);
  return unexpected == 0 ? 0 : 1;
}
