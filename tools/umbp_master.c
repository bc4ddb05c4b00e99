/*
 * umbp-master - distributed mode's directory: which node of the cluster
 * holds which key.  A thin main over master/master.h through the daemons'
 * one main (common/tool_main.h): options in, SIGTERM / SIGINT to a clean
 * stop, SIGPIPE ignored.  Soft state only: a restarted master relearns every
 * live node from their resyncs.
 */
#include <stdio.h>
#include <unistd.h>

#include "master.h"
#include "options.h"
#include "tool_main.h"

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
    umbp_tool_print_options(master_options, NULL);
}

static int create(const char *json, void **svc, char *err, size_t errlen)
{
    return umbp_master_create(json, (struct umbp_master **)svc, err, errlen);
}

static void run(void *svc)
{
    const char *lease = umbp_master_lease_url(svc);
    fprintf(stderr, "umbp-master: serving %s (pid %ld)%s%s\n", umbp_master_address(svc),
            (long)getpid(), lease ? "; it leads while it holds the lease in " : "",
            lease ? lease : "");
    umbp_master_run(svc);
}

static void stop(void *svc)
{
    umbp_master_stop(svc); /* async-signal-safe: an ev_async */
}

static void destroy(void *svc)
{
    fprintf(stderr, "umbp-master: stopping\n");
    umbp_master_destroy(svc);
}

int main(int argc, char **argv)
{
    static const struct umbp_tool tool = {
        .name = "umbp-master", .usage = usage, .help = help, .create = create,
        .run = run, .stop = stop, .destroy = destroy};
    return umbp_tool_main(&tool, argc, argv);
}
