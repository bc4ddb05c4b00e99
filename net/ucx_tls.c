/*
 * ucx_tls.c - reading a UCX transport list; ucx_tls.h says what each
 * answer means.  A list longer than 255 bytes is read up to there (UCX's
 * own names are short; the node keeps 128 bytes of the list).
 */
#include "ucx_tls.h"

#include <stdio.h>
#include <string.h>

bool ucx_tls_names_tcp(const char *tls)
{
    bool except = tls[0] == '^';
    bool named = false;
    char buf[256];
    snprintf(buf, sizeof(buf), "%s", tls + except);
    for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save))
        named = named || !strcmp(t, "tcp") || !strcmp(t, "all");
    return except ? !named : named;
}

bool ucx_tls_tcp_only(const char *tls)
{
    if (tls[0] == '^')
        return false;
    bool tcp = false;
    char buf[256];
    snprintf(buf, sizeof(buf), "%s", tls);
    for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        if (!strcmp(t, "tcp"))
            tcp = true;
        else if (strcmp(t, "self"))
            return false;
    }
    return tcp;
}
