"""The shared libraries that libumbp.so, umbp-server, umbp and umbp-master
link besides the C and C++ runtimes, and the Debian / Ubuntu packages that
hold them (the same names on Debian 12 and Ubuntu 22.04 and 24.04).  The
wheel carries copies of them (connector/setup.py); cmake --install and a
UMBP_BUNDLE_DEPS=0 wheel do not, and their hosts install these packages
(docs/operations.md, "Runtime libraries").  umbp._lib names the package when
a dlopen fails for want of one; setup.py reads BASE_LIBRARIES (what it does
not bundle); test_import checks the built binaries' DT_NEEDED entries
against this table and docs/operations.md against it.
"""
import os
import re

RUNTIME_PACKAGES = {
    "libev.so.4": "libev4",
    "libjson-c.so.5": "libjson-c5",
    "libnuma.so.1": "libnuma1",
    "libxxhash.so.0": "libxxhash0",
    "libsodium.so.23": "libsodium23",
    "libhiredis.so.0.14": "libhiredis0.14",      # the lease store (Redis)
    "libssl.so.3": "libssl3",                    # rediss:// (UMBP_WITH_OPENSSL)
    "libcrypto.so.3": "libssl3",
    "libucp.so.0": "libucx0",                    # distributed mode (UCX)
    "libucs.so.0": "libucx0",
    "libuct.so.0": "libucx0",
    "libucm.so.0": "libucx0",
    "libmicrohttpd.so.12": "libmicrohttpd12",    # /metrics of umbp-server, umbp-master
}

# what every Linux host with a C++ runtime has
BASE_LIBRARIES = frozenset((
    "libc.so.6", "libm.so.6", "libdl.so.2", "libpthread.so.0", "librt.so.1",
    "ld-linux-x86-64.so.2", "ld-linux-aarch64.so.1", "libstdc++.so.6", "libgcc_s.so.1",
))

_MISSING = re.compile(r"(\S+): cannot open shared object file")
_VERSION = re.compile(r"version [`']([^']+)' not found")


def load_failure(path, message):
    """Why dlopen of the existing file path failed (its message), in words a
    user can act on; None when the message says nothing more specific."""
    m = _MISSING.match(message)
    if m and os.path.basename(m.group(1)) != os.path.basename(path):
        dep = os.path.basename(m.group(1))
        pkg = RUNTIME_PACKAGES.get(dep)
        where = ("Debian/Ubuntu package %s" % pkg) if pkg else "a library umbp does not list"
        return "it needs %s (%s), which this host lacks" % (dep, where)
    v = _VERSION.search(message)
    if v:
        return ("it was built against %s, newer than this host's libraries: build the wheel on "
                "this host, or on one with libraries no newer" % v.group(1))
    return None
