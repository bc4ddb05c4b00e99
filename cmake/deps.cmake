# Finds the Debian packages umbp builds against (scripts/setup.sh installs
# them).  pkg-config for those that ship a .pc file; libev ships none.
find_package(PkgConfig REQUIRED)
find_package(Threads REQUIRED)
pkg_check_modules(CK REQUIRED IMPORTED_TARGET ck)
pkg_check_modules(NUMA REQUIRED IMPORTED_TARGET numa)
pkg_check_modules(JSONC REQUIRED IMPORTED_TARGET json-c)
pkg_check_modules(XXHASH REQUIRED IMPORTED_TARGET libxxhash)
# key derivation (BLAKE2b), identical to Python's hashlib.blake2b
pkg_check_modules(SODIUM REQUIRED IMPORTED_TARGET libsodium)
# umbp-server's /metrics endpoint only (server/metrics.c); not in libumbp
pkg_check_modules(MHD REQUIRED IMPORTED_TARGET libmicrohttpd)

find_path(LIBEV_INCLUDE_DIR ev.h PATH_SUFFIXES libev)
find_library(LIBEV_LIBRARY NAMES ev)
if(NOT LIBEV_INCLUDE_DIR OR NOT LIBEV_LIBRARY)
  message(FATAL_ERROR "libev not found: run scripts/setup.sh (Debian package libev-dev)")
endif()
add_library(umbp_libev INTERFACE)
target_include_directories(umbp_libev INTERFACE ${LIBEV_INCLUDE_DIR})
target_link_libraries(umbp_libev INTERFACE ${LIBEV_LIBRARY})

add_library(umbp_deps INTERFACE)
target_link_libraries(umbp_deps INTERFACE PkgConfig::CK PkgConfig::NUMA
  PkgConfig::JSONC PkgConfig::XXHASH PkgConfig::SODIUM umbp_libev Threads::Threads m)

# The master's leader lease and its discovery in Redis (net/lease_redis.c):
# optional.  Without it a redis:// master address or lease_url is refused
# naming the package, and the tests that need Redis skip.
pkg_check_modules(HIREDIS IMPORTED_TARGET GLOBAL hiredis)
if(HIREDIS_FOUND)
  message(STATUS "hiredis ${HIREDIS_VERSION}: the master's Redis lease built")
  target_link_libraries(umbp_deps INTERFACE PkgConfig::HIREDIS)
  target_compile_definitions(umbp_deps INTERFACE UMBP_HAVE_HIREDIS=1)
else()
  message(STATUS "hiredis not found (pkg-config hiredis): redis:// leases not built; "
                 "run scripts/setup.sh (libhiredis-dev)")
endif()

# TLS to Redis and to its sentinels (rediss://, net/redis_conn.c): OpenSSL,
# optional.  Without it a rediss:// lease_url or master_address is refused
# at open naming the package (libssl-dev), and the TLS tests skip.
# UMBP_WITH_OPENSSL=OFF builds without it even where it is installed (CI
# builds test_lease that way, so the build without TLS keeps compiling and
# refusing rediss:// by name).
option(UMBP_WITH_OPENSSL "Build TLS to Redis (rediss://) where OpenSSL is found" ON)
if(UMBP_WITH_OPENSSL)
  pkg_check_modules(OPENSSL IMPORTED_TARGET GLOBAL openssl)
endif()
if(OPENSSL_FOUND AND HIREDIS_FOUND)
  message(STATUS "OpenSSL ${OPENSSL_VERSION}: rediss:// leases (TLS to Redis) built")
  target_link_libraries(umbp_deps INTERFACE PkgConfig::OPENSSL)
  target_compile_definitions(umbp_deps INTERFACE UMBP_HAVE_OPENSSL=1)
elseif(HIREDIS_FOUND AND NOT UMBP_WITH_OPENSSL)
  message(STATUS "UMBP_WITH_OPENSSL=OFF: rediss:// leases not built")
elseif(HIREDIS_FOUND)
  message(STATUS "OpenSSL not found (pkg-config openssl): rediss:// leases not built; "
                 "run scripts/setup.sh (libssl-dev)")
endif()
