/*
 * tool_main.h - the one main of the umbp daemons (umbp-server, umbp-master):
 * `--config FILE | --json JSON | --help` into a JSON config string, --help
 * from the tool's option tables, then create, SIGTERM / SIGINT to a clean
 * stop (SIGPIPE ignored), run, destroy.  Each tool gives its texts and its
 * service's life as a struct umbp_tool; the messages and exit codes are the
 * same for every tool but for the name in front of them.
 *
 * Exit codes: 0 (served and stopped, or --help), 1 (the config was refused:
 * create's message), 2 (bad arguments or an unreadable --config file).
 */
#ifndef UMBP_COMMON_TOOL_MAIN_H
#define UMBP_COMMON_TOOL_MAIN_H

#include <stdio.h>

#include "umbp/tier.h"

struct umbp_tool {
    const char *name;      /* "umbp-server": in front of every message */
    void (*usage)(FILE *f); /* the usage text: --help, and after an argument error */
    void (*help)(void);    /* --help to stdout: usage, then the option tables */
    /* The service from the config text; < 0 with err written when refused. */
    int (*create)(const char *json, void **svc, char *err, size_t errlen);
    /* Says where it serves (stderr), then serves until stop. */
    void (*run)(void *svc);
    /* Called from the signal handler: async-signal-safe; svc may be NULL
     * (a signal after run returned). */
    void (*stop)(void *svc);
    /* Says it stops (stderr), then frees everything. */
    void (*destroy)(void *svc);
};

/* The whole main of a tool; returns its exit code. */
int umbp_tool_main(const struct umbp_tool *t, int argc, char **argv);

/* --help's listing of an option table: every option, or those named in only
 * (NULL-terminated; NULL = all), with its default and its help. */
void umbp_tool_print_options(const struct umbp_option *opts, const char *const *only);

#endif
