# What devdb.sh and ha.sh share; sourced, with $here set to the checkout.

# As root, every server-side command runs as `postgres`, from / since the
# caller's folder may be one postgres cannot enter (every path here is absolute).
if [ "$(id -u)" -eq 0 ]; then
    as_server() { (cd / && runuser -u postgres -- "$@"); }
else
    as_server() { "$@"; }
fi

# pick_datadir OVERRIDE NAME TAG: the data folder: OVERRIDE when set, else
# $here/.NAME, else (root, and postgres cannot reach the checkout)
# switchboard-TAG-<the checkout's path hashed> under the temp dir.
pick_datadir() {
    if [ -n "$1" ]; then
        realpath -m "$1"
        return
    fi
    # Root creates the folder and hands it to postgres, which then only needs to
    # traverse the path to the checkout.
    if [ "$(id -u)" -ne 0 ] || runuser -u postgres -- test -x "$here" 2>/dev/null; then
        echo "$here/.$2"
        return
    fi
    local tag
    tag=$(printf '%s' "$here" | sha1sum | cut -c1-12)
    echo "${TMPDIR:-/tmp}/switchboard-$3-$tag"
}
