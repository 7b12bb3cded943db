# shellcheck shell=bash
# Where cargo puts the release binaries of the repository at $1, as it says itself
# (CARGO_TARGET_DIR, relative to the repository, or a config's build.target-dir); without
# cargo yet, where it would by default. For scripts/dev and scripts/bench, so that neither
# runs binaries older than the ones cargo just built.
release_dir() {
    local repo=$1 target
    target=$(cd "$repo" && "${CARGO:-cargo}" metadata --no-deps --format-version 1 2>/dev/null |
        sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p') || target=""
    (cd "$repo" && realpath -m "${target:-${CARGO_TARGET_DIR:-target}}/release")
}
