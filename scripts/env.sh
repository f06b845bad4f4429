# Shared settings for the project's scripts (sourced, not run).
# KUBENPU_CACHE survives between runs on one machine; everything in it can be rebuilt.
export KUBENPU_CACHE=${KUBENPU_CACHE:-/var/cache/kubenpu}
export KUBENPU_APT_CONFIG=$KUBENPU_CACHE/apt/apt.conf
mkdir -p "$KUBENPU_CACHE"

# A private APT configuration that sees bookworm, trixie, sid and the backports,
# so we can download kernels and tools from any of them without touching the host's APT.
apt_private_update() {
  local dir=$KUBENPU_CACHE/apt
  local stamp=$dir/updated
  if [[ -e $stamp && -z $(find "$stamp" -mmin +1440) ]]; then return 0; fi
  mkdir -p "$dir"/{lists/partial,archives/partial,etc/preferences.d,etc/apt.conf.d}
  cat >"$dir/sources.list" <<SRC
deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian bookworm main
deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian bookworm-backports main
deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian trixie main
deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian trixie-backports main
deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian sid main
SRC
  cat >"$KUBENPU_APT_CONFIG" <<CONF
Dir::Etc::SourceList "$dir/sources.list";
Dir::Etc::SourceParts "$dir/etc/none";
Dir::Etc::Preferences "$dir/etc/preferences";
Dir::Etc::PreferencesParts "$dir/etc/preferences.d";
Dir::Etc::Parts "$dir/etc/apt.conf.d";
Dir::State "$dir";
Dir::State::Lists "$dir/lists";
Dir::State::status "$dir/status";
Dir::Cache "$dir";
Dir::Cache::Archives "$dir/archives";
Acquire::Languages "none";
Acquire::Check-Valid-Until "false";
CONF
  touch "$dir/status"
  APT_CONFIG=$KUBENPU_APT_CONFIG apt-get update -q >/dev/null
  touch "$stamp"
}

# Install host packages (bookworm, the host's own suite) only when missing.
host_install() {
  local missing=()
  for p in "$@"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
  ((${#missing[@]})) || return 0
  [[ -e /var/lib/apt/lists/lock && -n $(ls /var/lib/apt/lists/*Packages* 2>/dev/null) ]] || apt-get update -q >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null
}
