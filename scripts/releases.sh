# Sourced by keel's scripts: the supported libtorch releases, read from
# cmake/torch-releases.txt (the only list), oldest first.
#   keel_releases   every supported release
#   keel_golden     the first (the upgrade check records on it)
#   keel_newest     the last
#   keel_ci_extra   the releases tagged "ci" (CI tests them beside the two)
# shellcheck shell=bash
_keel_releases_file="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/cmake/torch-releases.txt"
mapfile -t keel_releases < <(sed -e 's/#.*//' "$_keel_releases_file" | awk 'NF {print $1}')
mapfile -t keel_ci_extra < <(sed -e 's/#.*//' "$_keel_releases_file" | awk '$2 == "ci" {print $1}')
keel_golden=${keel_releases[0]}
keel_newest=${keel_releases[${#keel_releases[@]}-1]}
# keel_is_supported RELEASE: whether RELEASE is on the list.
keel_is_supported() {
  local r
  for r in "${keel_releases[@]}"; do [ "$r" = "$1" ] && return 0; done
  return 1
}
