# The build of record (PGXS): `make` builds the library, `make install`
# installs it with its control file and SQL scripts (PG_CONFIG chooses the
# PostgreSQL, DESTDIR stages), and the installcheck targets below run the
# suites against the installed copy. test/run-all runs them all; CMake
# (CMakeLists.txt) only adds the GoogleTest unit tests and
# compile_commands.json, with the flags defined here.

EXTENSION = idempotency
MODULE_big = idempotency
# The install script of the current version is built from idempotency.sql
# (the whole schema, kept by hand); the older versions' scripts and the
# update scripts are installed as they are.
EXTVERSION = $(shell sed -n "s/^default_version = '\(.*\)'$$/\1/p" idempotency.control)
DATA_built = idempotency--$(EXTVERSION).sql
DATA = $(filter-out $(DATA_built),$(wildcard idempotency--*.sql))
PGFILEDESC = "idempotency - exactly-once processing of retried requests"

OBJS = $(patsubst %.cpp,%.o,$(wildcard src/*/*.cpp))

REGRESS = $(basename $(notdir $(wildcard sql/*.sql)))
REGRESS_OPTS = --temp-instance=tmp_regress --temp-config=$(srcdir)/test/preload.conf
ISOLATION = $(basename $(notdir $(wildcard test/isolation/specs/*.spec)))
ISOLATION_OPTS = --inputdir=$(srcdir)/test/isolation  \
	--temp-instance=tmp_isolation --temp-config=$(srcdir)/test/preload.conf
TAP_TESTS = 1
EXTRA_CLEAN = tmp_regress tmp_isolation output_iso results regression.diffs regression.out

# The C++ flags of every build, read by CMakeLists.txt as well: keep them on
# this one line. -Wno-register: PostgreSQL's headers use `register`, which
# C++17 removed (-isystem already hides it from g++, not from every tool).
IDEMPOTENCY_CXXFLAGS = -std=c++17 -Wall -Wextra -Wno-register

# The library's version, META.json's: in its magic block (PostgreSQL 18's
# pg_get_loaded_modules() shows it).
IDEMPOTENCY_VERSION := $(shell sed -n 's/^   "version": "\(.*\)",$$/\1/p' $(dir $(lastword $(MAKEFILE_LIST)))META.json | head -n 1)

# WERROR=1 (CI sets it) makes every warning an error.
PG_CONFIG ?= pg_config
PG_CXXFLAGS = $(IDEMPOTENCY_CXXFLAGS) $(if $(WERROR),-Werror) \
	-isystem $(shell $(PG_CONFIG) --includedir-server) -I$(srcdir)/include \
	-DIDEMPOTENCY_VERSION='"$(IDEMPOTENCY_VERSION)"'
SHLIB_LINK += -lstdc++
# Hashing uses the OpenSSL the server is built with (docs/architecture.md,
# "Hashing"): linked where pg_config.h defines USE_OPENSSL, so that the
# library's dependencies say so.
ifneq ($(shell grep -s '^\#define USE_OPENSSL 1' $(shell $(PG_CONFIG) --includedir-server)/pg_config.h),)
SHLIB_LINK += -lcrypto
endif

# Rebuild every object whose headers changed (.deps/*.Po, written by the
# compiler): a struct changed in a header must not leave objects built with
# its old layout. Object basenames are unique across src/*/.
override autodepend = yes

# No LLVM bitcode for the JIT: the extension's functions are not inlinable
# expressions, and the bitcode step would need clang.
override with_llvm = no

PGXS := $(shell $(PG_CONFIG) --pgxs)
ifeq ($(PGXS),)
$(error PG_CONFIG=$(PG_CONFIG) is not a working pg_config: set PG_CONFIG to the pg_config of the PostgreSQL to build for)
endif
include $(PGXS)

$(DATA_built): idempotency.sql
	cp $< $@

# The layering check (includes point down the layers, project headers by
# their idempotency/ prefix; docs/architecture.md) runs before anything is
# compiled: a build that breaks the layers fails.
.PHONY: check-layers
check-layers:
	$(srcdir)/test/unit/layers.sh

# The C++ sources as .clang-format lays them out (CI runs it).
FORMATTED_SOURCES = $(wildcard $(srcdir)/src/*/*.cpp $(srcdir)/include/idempotency/*.hpp \
	$(srcdir)/include/idempotency/*/*.hpp $(srcdir)/test/unit/*.cpp)
.PHONY: check-format
check-format:
	clang-format --dry-run --Werror $(FORMATTED_SOURCES)
$(OBJS): | check-layers

# clang-tidy (.clang-tidy chooses the checks) over each source with the
# flags that compile it, any finding an error; `make -j2 check-tidy` runs
# two at a time (CI runs it). Clang does not know a few of g++'s warning
# flags.
TIDY_SOURCES = $(wildcard $(srcdir)/src/*/*.cpp)
.PHONY: check-tidy $(TIDY_SOURCES:=.tidy)
check-tidy: $(TIDY_SOURCES:=.tidy)
# Clang's count of the warnings it hid in PostgreSQL's headers is left out.
$(TIDY_SOURCES:=.tidy): %.tidy: %
	@err=$$(mktemp) && status=0 && \
	clang-tidy --quiet --warnings-as-errors='*' $< -- \
		$(CXXFLAGS) $(CPPFLAGS) -Wno-unknown-warning-option 2>$$err || status=$$?; \
	grep -v '^[0-9]* warnings\{0,1\} generated\.$$' $$err >&2; rm -f $$err; exit $$status

# The TAP files' shared module (IdempotencyTest.pm) lives beside them.
PG_PROVE_FLAGS += -I test/tap

# One suite at a time, for test/run-all; REGRESS=name (or ISOLATION=name)
# runs one file: every file sets up what it needs.
.PHONY: installcheck-regress installcheck-isolation installcheck-tap
installcheck-regress:
	$(pg_regress_installcheck) $(REGRESS_OPTS) $(REGRESS)
installcheck-isolation:
	$(pg_isolation_regress_installcheck) $(ISOLATION_OPTS) $(ISOLATION)
# A PostgreSQL configured without --enable-tap-tests would make PGXS print
# a notice and succeed having run nothing: fail instead.
#
# Without Citus in $(PG_CONFIG), the Citus files (test/tap/*_citus.pl) are left out
# of a default run and reported as skipped, so that prove's PASS speaks only
# for the files that ran (PROVE_TESTS naming them still runs them: prove
# then reports their skip_all as skipped).
CITUS_SO = $(wildcard $(shell $(PG_CONFIG) --pkglibdir)/citus.so)
ifeq ($(origin PROVE_TESTS)$(CITUS_SO),undefined)
CITUS_TAP_SKIPPED = $(wildcard test/tap/*_citus.pl)
PROVE_TESTS = $(filter-out $(CITUS_TAP_SKIPPED),$(wildcard test/tap/*.pl))
endif
installcheck-tap:
ifeq ($(enable_tap_tests),yes)
	$(prove_installcheck)
ifneq ($(CITUS_TAP_SKIPPED),)
	@echo "SKIPPED (Citus is not installed in $(PG_CONFIG)): $(CITUS_TAP_SKIPPED)"
endif
else
	@echo "TAP tests not enabled in $(PG_CONFIG) (configure PostgreSQL with --enable-tap-tests)" >&2; exit 1
endif
