# PGXS build: `make && make install` builds and installs the extension;
# `make installcheck` runs pg_regress, the isolation specs and the TAP tests
# on throwaway clusters with the library preloaded (see test/run-all).

EXTENSION = idempotency
MODULE_big = idempotency
DATA = $(wildcard idempotency--*.sql)
PGFILEDESC = "idempotency - exactly-once processing of retried requests"

SOURCES = \
	src/boundary/boundary.cpp \
	src/entry/module.cpp \
	src/entry/settings.cpp \
	src/fingerprint/fingerprint.cpp \
	src/fingerprint/request_hash.cpp \
	src/protocol/call.cpp \
	src/protocol/claim.cpp \
	src/protocol/fn.cpp \
	src/protocol/rules.cpp \
	src/protocol/statement_cache.cpp \
	src/stats/stats.cpp \
	src/storage/commit_guard.cpp \
	src/storage/keys.cpp \
	src/worker/database_round.cpp \
	src/worker/expire.cpp \
	src/worker/settings.cpp \
	src/worker/status.cpp \
	src/worker/worker.cpp
OBJS = $(SOURCES:.cpp=.o)

# call_retry runs first: it creates the extension, the accounts of the retry
# scenario and the sqlstate_of() helper that later files use.
REGRESS = call_retry $(filter-out call_retry,$(basename $(notdir $(wildcard $(srcdir)/sql/*.sql))))
REGRESS_OPTS = --temp-instance=tmp_regress --temp-config=$(srcdir)/test/preload.conf
ISOLATION = $(basename $(notdir $(wildcard $(srcdir)/specs/*.spec)))
ISOLATION_OPTS = --temp-instance=tmp_isolation --temp-config=$(srcdir)/test/preload.conf
TAP_TESTS = 1
EXTRA_CLEAN = tmp_regress tmp_isolation output_iso results regression.diffs regression.out

PG_CONFIG ?= pg_config
PG_CXXFLAGS = -std=c++17 -Wall -Wextra -Wno-register -Wno-missing-field-initializers \
	-isystem $(shell $(PG_CONFIG) --includedir-server) -I$(srcdir)/src
SHLIB_LINK += -lstdc++

# No LLVM bitcode for the JIT: the extension's functions are not inlinable
# expressions, and the bitcode step would need clang.
override with_llvm = no

PGXS := $(shell $(PG_CONFIG) --pgxs)
include $(PGXS)

srcdir ?= .

# One suite at a time, for test/run-all.
.PHONY: installcheck-regress installcheck-isolation installcheck-tap
installcheck-regress:
	$(pg_regress_installcheck) $(REGRESS_OPTS) $(REGRESS)
installcheck-isolation:
	$(pg_isolation_regress_installcheck) $(ISOLATION_OPTS) $(ISOLATION)
installcheck-tap:
	$(prove_installcheck)
