/*
 * umbp-master - distributed mode's directory: which node of the cluster
 * holds which key.  A thin main over master/master.h: options in, SIGTERM /
 * SIGINT to a clean stop, SIGPIPE ignored.  Soft state only: a restarted
 * master relearns every live node from their resyncs.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "master.h"
#include "options.h"

static struct umbp_master *volatile running;

static void on_signal(int sig)
{
    (void)sig;
    umbp_master_stop(running); /* async-signal-safe: an ev_async */
}

static void usage(FILE *f)
{
    fprintf(f, "usage: umbp-master [--config FILE | --json JSON]\n"
               "\n"
               "Serves distributed mode's directory (key -> owner nodes) over TCP.\n"
               "UMBP_<OPTION> environment variables override the config.  Every\n"
               "option: docs/configuration.md; bounds and failures: docs/operations.md.\n");
}

static void help(void)
{
    usage(stdout);
    printf("\noptions:\n");
    for (const struct umbp_option *o = master_options; o->name; o++)
        printf("  %-22s default \"%s\"\n  %-22s %s\n", o->name, o->def, "", o->help);
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
            fprintf(stderr, "umbp-master: %s '%s'\n",
                    dst ? "missing the value of" : "unknown argument", argv[i]);
            usage(stderr);
            return -1;
        }
        *dst = argv[++i];
    }
    if (file && text) {
        fprintf(stderr, "umbp-master: give --config or --json, not both\n");
        return -1;
    }
    char err[512];
    *json = file ? umbp_config_file_read(file, err, sizeof(err)) : strdup(text ? text : "");
    if (!*json && file)
        fprintf(stderr, "umbp-master: --config %s\n", err);
    return *json ? 0 : -1;
}

int main(int argc, char **argv)
{
    char *json = NULL, err[1024] = "";
    int rc = parse_args(argc, argv, &json);
    if (rc)
        return rc > 0 ? 0 : 2;
    struct umbp_master *m = NULL;
    rc = umbp_master_create(json, &m, err, sizeof(err));
    free(json);
    if (rc < 0) {
        fprintf(stderr, "umbp-master: %s\n", err);
        return 1;
    }
    running = m;
    struct sigaction sa = {.sa_handler = on_signal};
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    fprintf(stderr, "umbp-master: serving %s (pid %ld)\n", umbp_master_address(m),
            (long)getpid());
    umbp_master_run(m);
    running = NULL;
    fprintf(stderr, "umbp-master: stopping\n");
    umbp_master_destroy(m);
    return 0;
}
