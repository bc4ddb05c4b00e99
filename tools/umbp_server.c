/*
 * umbp-server - the standalone-mode daemon: one per host (per DP index and
 * lookup_instance), owning the shared-memory pool every engine process on
 * the host attaches to.  A thin main over server/server.h through the
 * daemons' one main (common/tool_main.h): options in, SIGTERM / SIGINT to a
 * clean stop, SIGPIPE ignored.
 */
#include <stdio.h>
#include <unistd.h>

#include "options.h"
#include "tool_main.h"

#include "server.h"
#include "server_config.h"
#include "shm_config.h"

static void usage(FILE *f)
{
    fprintf(f, "usage: umbp-server [--config FILE | --json JSON]\n"
               "\n"
               "Serves one host's umbp pool (standalone mode) on a Unix socket.\n"
               "The config takes the engines' options (options only engines use are\n"
               "accepted and ignored), the pool's: capacity_bytes (or\n"
               "total_capacity_bytes), lease_ttl_ms, log_level, dram_*, and the server\n"
               "options below.  An engine refuses dram_* and the server options, so\n"
               "give the server a file of its own.  UMBP_<OPTION> environment\n"
               "variables override the file.  Every option: docs/configuration.md and\n"
               "docs/operations.md (Standalone mode).\n");
}

static void help(void)
{
    static const char *const socket_opts[] = {"socket_dir", "dp_rank", "lookup_instance",
                                              NULL};
    usage(stdout);
    printf("\nwhere the socket is (shared with the clients):\n");
    umbp_tool_print_options(shm_options, socket_opts);
    printf("\nserver options:\n");
    umbp_tool_print_options(srv_options, NULL);
    printf("\nSIGTERM or SIGINT stops the server cleanly.  With dram_shm_name the pool and its\n"
           "journal stay in /dev/shm and the next server adopts every published object;\n"
           "without it the pool's objects are lost.\n");
}

static int create(const char *json, void **svc, char *err, size_t errlen)
{
    return umbp_server_create(json, (struct umbp_server **)svc, err, errlen);
}

static void run(void *svc)
{
    fprintf(stderr, "umbp-server: serving %s (pool %llu bytes, pid %ld)\n",
            umbp_server_socket_path(svc), umbp_server_pool_bytes(svc), (long)getpid());
    umbp_server_run(svc);
}

static void stop(void *svc)
{
    umbp_server_stop(svc); /* async-signal-safe: an ev_async */
}

static void destroy(void *svc)
{
    fprintf(stderr, "umbp-server: stopping (%s)\n", umbp_server_socket_path(svc));
    umbp_server_destroy(svc);
}

int main(int argc, char **argv)
{
    static const struct umbp_tool tool = {
        .name = "umbp-server", .usage = usage, .help = help, .create = create,
        .run = run, .stop = stop, .destroy = destroy};
    return umbp_tool_main(&tool, argc, argv);
}
