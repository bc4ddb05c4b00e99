/*
 * tool_main.c - the one main of umbp-server and umbp-master (tool_main.h):
 * arguments into a JSON config string, --help, the stop signals, the
 * service's life.  Process-wide: one tool per process, main thread only.
 */
#include <signal.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "options.h"
#include "tool_main.h"

/* What the signal handler stops: set before the handlers are installed,
 * svc cleared once run has returned (stop must then accept NULL). */
static void (*volatile stop_fn)(void *svc);
static void *volatile stop_svc;

static void on_signal(int sig)
{
    (void)sig;
    stop_fn(stop_svc); /* async-signal-safe: each tool's stop is an ev_async */
}

/* SIGTERM and SIGINT call t->stop on svc; SIGPIPE is ignored (a peer that
 * closed shows as EPIPE on the write). */
static void handle_signals(const struct umbp_tool *t, void *svc)
{
    stop_fn = t->stop;
    stop_svc = svc;
    struct sigaction sa = {.sa_handler = on_signal};
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
}

void umbp_tool_print_options(const struct umbp_option *opts, const char *const *only)
{
    for (const struct umbp_option *o = opts; o->name; o++) {
        bool shown = !only;
        for (const char *const *n = only; n && *n; n++)
            shown = shown || strcmp(*n, o->name) == 0;
        if (shown)
            printf("  %-22s default \"%s\"\n  %-22s %s\n", o->name, o->def, "", o->help);
    }
}

/* The config text from the arguments: 0, 1 (help shown), or -1 (error shown). */
static int parse_args(const struct umbp_tool *t, int argc, char **argv, char **json)
{
    const char *file = NULL, *text = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            t->help();
            return 1;
        }
        const char **dst = !strcmp(argv[i], "--config") ? &file
                           : !strcmp(argv[i], "--json") ? &text : NULL;
        if (!dst || i + 1 == argc) {
            fprintf(stderr, "%s: %s '%s'\n", t->name,
                    dst ? "missing the value of" : "unknown argument", argv[i]);
            t->usage(stderr);
            return -1;
        }
        *dst = argv[++i];
    }
    if (file && text) {
        fprintf(stderr, "%s: give --config or --json, not both\n", t->name);
        return -1;
    }
    char err[512];
    *json = file ? umbp_config_file_read(file, err, sizeof(err)) : strdup(text ? text : "");
    if (!*json && file)
        fprintf(stderr, "%s: --config %s\n", t->name, err);
    return *json ? 0 : -1;
}

int umbp_tool_main(const struct umbp_tool *t, int argc, char **argv)
{
    char *json = NULL, err[1024] = "";
    int rc = parse_args(t, argc, argv, &json);
    if (rc)
        return rc > 0 ? 0 : 2;
    void *svc = NULL;
    rc = t->create(json, &svc, err, sizeof(err));
    free(json);
    if (rc < 0) {
        fprintf(stderr, "%s: %s\n", t->name, err);
        return 1;
    }
    handle_signals(t, svc);
    t->run(svc);
    stop_svc = NULL;
    t->destroy(svc);
    return 0;
}
