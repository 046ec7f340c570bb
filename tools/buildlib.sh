# Shared by tools/kube/build.sh and tools/traces/build.sh: build Go tools from wrapper modules
# into a versioned cache OUTSIDE the work tree, skip when the cache is complete, print timings,
# fail loudly. Source it after setting HERE (the tool's directory); then:
#
#   KEY=...; BIN_DIR=...; BINARIES=(...)   # what the cache holds
#   CACHE_FILES=(...)     # optional: other files (relative to BIN_DIR) a complete cache has
#   begin_build "$@"      # --print-bin-dir / --force / --help; exits 0 when already cached
#   build NAME MODULE_DIR PACKAGE LDFLAGS  # once per binary (kept when already built, unless --force)
#   finish_build [key=value ...]           # writes the marker, prints the summary and BIN_DIR
#
# The machine's go env (GOPROXY, GOSUMDB, GOFLAGS, GOCACHE, GOMODCACHE) is used as is.

die() { echo "build.sh: ERROR: $*" >&2; exit 1; }
log() { echo "build.sh: $*" >&2; }

# Version of MODULE as required in DIR/go.mod (require lines only, not replace lines).
modver() {
	local dir=$1 mod=$2 v
	v=$(awk -v m="$mod" '
		$1 == "require" && $2 == m && $3 ~ /^v/ { print $3; exit }
		$1 == m && $2 ~ /^v/ && $0 !~ /=>/      { print $2; exit }
	' "$HERE/$dir/go.mod")
	[[ -n "$v" ]] || die "cannot find the version of $mod in $HERE/$dir/go.mod"
	echo "$v"
}

_cache_complete() {
	[[ -f "$BIN_DIR/.build-complete" ]] || return 1
	local b
	for b in "${BINARIES[@]}"; do [[ -x "$BIN_DIR/$b" ]] || return 1; done
	for b in ${CACHE_FILES[@]+"${CACHE_FILES[@]}"}; do [[ -f "$BIN_DIR/$b" ]] || return 1; done
}

begin_build() {
	local script=${BASH_SOURCE[1]}
	FORCE=0
	case "${1:-}" in
		--print-bin-dir) echo "$BIN_DIR"; exit 0 ;;
		--force) FORCE=1 ;;
		"") ;;
		-h|--help) sed -n '2,/^set -euo/p' "$script" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
		*) die "unknown argument: $1 (use --print-bin-dir, --force or --help)" ;;
	esac
	if [[ $FORCE == 0 ]] && _cache_complete; then
		log "cached: $BIN_DIR ($(tr '\n' ' ' < "$BIN_DIR/.build-complete"))"
		echo "$BIN_DIR"
		exit 0
	fi
	command -v go >/dev/null || die "go is not on PATH (need Go >= 1.26; the modules say 'go 1.26.0')"
	mkdir -p "$BIN_DIR" || die "cannot create $BIN_DIR"
	# One builder at a time per cache dir; a second caller waits, then finds the cache complete.
	exec 9>"$BIN_DIR/.lock"
	if command -v flock >/dev/null; then
		flock 9 || die "cannot lock $BIN_DIR/.lock"
		if [[ $FORCE == 0 ]] && _cache_complete; then
			log "cached (built by a concurrent run): $BIN_DIR"
			echo "$BIN_DIR"
			exit 0
		fi
	fi
	rm -f "$BIN_DIR/.build-complete"
	log "building $KEY into $BIN_DIR with $(go version | awk '{print $3}')"
	TOTAL_START=$SECONDS
	SUMMARY=()
}

# build NAME MODULE_DIR PACKAGE LDFLAGS: go build into NAME.tmp, then rename (atomic). A binary
# already in BIN_DIR is complete (only renamed there whole) and is kept unless --force: a cache
# that lacks only a newly added tool builds just that tool.
build() {
	local name=$1 dir=$2 pkg=$3 ldflags=$4 start=$SECONDS secs
	if [[ $FORCE == 0 && -x "$BIN_DIR/$name" ]]; then
		SUMMARY+=("$(printf '%-24s  kept  %s' "$name" "$(du -h "$BIN_DIR/$name" | cut -f1)")")
		log "[$name] already built, kept (use --force to rebuild)"
		return 0
	fi
	log "[$name] go build $pkg (in ${HERE#"$(dirname "$(dirname "$HERE")")/"}/$dir) ..."
	if ! (cd "$HERE/$dir" && CGO_ENABLED=0 go build -trimpath -ldflags "$ldflags" \
			-o "$BIN_DIR/$name.tmp" "$pkg") >&2; then
		rm -f "$BIN_DIR/$name.tmp"
		die "[$name] go build $pkg FAILED after $((SECONDS - start))s (see the go output above)"
	fi
	mv -f "$BIN_DIR/$name.tmp" "$BIN_DIR/$name"
	secs=$((SECONDS - start))
	SUMMARY+=("$(printf '%-24s %5ss  %s' "$name" "$secs" "$(du -h "$BIN_DIR/$name" | cut -f1)")")
	log "[$name] done in ${secs}s"
}

# finish_build [key=value ...]: the marker that makes the next run skip, then the summary.
finish_build() {
	local marker="$BIN_DIR/.build-complete" s
	{
		echo "key=$KEY"
		printf '%s\n' "$@"
		echo "go=$(go version | awk '{print $3}')"
		echo "built=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
		echo "seconds=$((SECONDS - TOTAL_START))"
	} > "$marker.tmp"
	mv -f "$marker.tmp" "$marker"
	log "built in $((SECONDS - TOTAL_START))s total:"
	for s in "${SUMMARY[@]}"; do log "  $s"; done
	echo "$BIN_DIR"
}
