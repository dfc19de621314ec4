#!/usr/bin/env bash
# Makes the vendored RustSec advisory database (deny/advisory-db/, a snapshot: see its README)
# the git repository cargo-deny reads, where deny.toml's db-path says (target/advisory-dbs/), so
# that `cargo deny --offline check advisories` works without reaching GitHub. Its one commit is
# dated as the snapshot, so cargo-deny's staleness check measures the snapshot's age.
#
#   scripts/advisory-db.sh        (make lint runs it)
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
source_dir=$root/deny/advisory-db
# cargo-deny names a database's directory after its URL (deny.toml's db-urls).
db=$root/target/advisory-dbs/advisory-db-3157b0e258782691
snapshot_date=$(sed -n 's/^- date: //p' "$source_dir/README.md")

rm -rf "$db"
mkdir -p "$db"
cp -R "$source_dir/crates" "$source_dir/LICENSE.txt" "$source_dir/LICENSES" "$db/"
export GIT_AUTHOR_NAME=cri-imaged GIT_AUTHOR_EMAIL=cri-imaged@localhost
export GIT_COMMITTER_NAME=cri-imaged GIT_COMMITTER_EMAIL=cri-imaged@localhost
export GIT_AUTHOR_DATE=$snapshot_date GIT_COMMITTER_DATE=$snapshot_date
git -C "$db" init -q
git -C "$db" add -A
git -C "$db" commit -q -m "RustSec advisory database, vendored snapshot of $snapshot_date"
