/*
 * umbp-server - the standalone-mode daemon: one per host (per DP index and
 * lookup_instance), owning the shared-memory pool every engine process on
 * the host attaches to.  A thin main over server/server.h: options in,
 * SIGTERM / SIGINT to a clean stop, SIGPIPE ignored.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "options.h"

#include "server.h"
#include "server_config.h"
#include "shm_config.h"


static struct umbp_server *volatile running;

static void on_signal(int sig)
{
    (void)sig;
    umbp_server_stop(running); /* async-signal-safe: an ev_async */
}

static void print_table(const struct umbp_option *opts, const char *const *only)
{
    for (const struct umbp_option *o = opts; o->name; o++) {
        bool shown = !only;
        for (const char *const *n = only; n && *n; n++)
            shown = shown || strcmp(*n, o->name) == 0;
        if (shown)
            printf("  %-22s default \"%s\"\n  %-22s %s\n", o->name, o->def, "", o->help);
    }
}

static void usage(FILE *f)
{
    fprintf(f, "usage: umbp-server [--config FILE | --json JSON]\n"
               "\n"
               "Serves one host's umbp pool (standalone mode) on a Unix socket.\n"
               "The config is the engines' own JSON: the same capacity_bytes (or\n"
               "total_capacity_bytes), lease_ttl_ms, log_level, dram_* and standalone\n"
               "options, plus the server options below.  UMBP_<OPTION> environment\n"
               "variables override the file.  Every option: docs/configuration.md and\n"
               "docs/operations.md (Standalone mode).\n");
}

static void help(void)
{
    static const char *const socket_opts[] = {"socket_dir", "dp_rank", "lookup_instance",
                                              NULL};
    usage(stdout);
    printf("\nwhere the socket is (shared with the clients):\n");
    print_table(shm_options, socket_opts);
    printf("\nserver options:\n");
    print_table(srv_options, NULL);
    printf("\nSIGTERM or SIGINT stops the server cleanly.  With dram_shm_name the pool and its\n"
           "journal stay in /dev/shm and the next server adopts every published object;\n"
           "without it the pool's objects are lost.\n");
}

static char *read_file(const char *path)
{
    char err[512];
    char *text = umbp_config_file_read(path, err, sizeof(err));
    if (!text)
        fprintf(stderr, "umbp-server: --config %s\n", err);
    return text;
}

/* The config text from the arguments: 0, 1 (help shown), or -1 (error shown). */
static int parse_args(int argc, char **argv, char **json)
{
    const char *file = NULL, *text = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            help();
            return 1;
        }
        const char **dst = !strcmp(argv[i], "--config") ? &file
                           : !strcmp(argv[i], "--json") ? &text : NULL;
        if (!dst || i + 1 == argc) {
            fprintf(stderr, "umbp-server: %s '%s'\n", dst ? "missing the value of" : "unknown argument",
                    argv[i]);
            usage(stderr);
            return -1;
        }
        *dst = argv[++i];
    }
    if (file && text) {
        fprintf(stderr, "umbp-server: give --config or --json, not both\n");
        return -1;
    }
    *json = file ? read_file(file) : strdup(text ? text : "");
    return *json ? 0 : -1;
}

static void handle_signals(void)
{
    struct sigaction sa = {.sa_handler = on_signal};
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
}

int main(int argc, char **argv)
{
    char *json = NULL, err[1024] = "";
    int rc = parse_args(argc, argv, &json);
    if (rc)
        return rc > 0 ? 0 : 2;
    struct umbp_server *s = NULL;
    rc = umbp_server_create(json, &s, err, sizeof(err));
    free(json);
    if (rc < 0) {
        fprintf(stderr, "umbp-server: %s\n", err);
        return 1;
    }
    running = s;
    handle_signals();
    fprintf(stderr, "umbp-server: serving %s (pool %llu bytes, pid %ld)\n",
            umbp_server_socket_path(s), umbp_server_pool_bytes(s), (long)getpid());
    umbp_server_run(s);
    running = NULL;
    fprintf(stderr, "umbp-server: stopping (%s)\n", umbp_server_socket_path(s));
    umbp_server_destroy(s);
    return 0;
}
