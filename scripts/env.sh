# Shared settings for the project's scripts (sourced, not run).
# KUBENPU_CACHE survives between runs on one machine; everything in it can be rebuilt.
export KUBENPU_CACHE=${KUBENPU_CACHE:-/var/cache/kubenpu}
export KUBENPU_APT_CONFIG=$KUBENPU_CACHE/apt/apt.conf
mkdir -p "$KUBENPU_CACHE"

# One install step at a time: `make test` runs two pytest workers whose tests may call the
# same fetch scripts on a cold cache (APT's lists and the unpack directories are shared).
# Re-entrant: a script run by the holder inherits the lock (fd 8) and the variable.
install_lock() {
  [[ -z ${KUBENPU_INSTALL_LOCKED:-} ]] || return 0
  exec 8>>"$KUBENPU_CACHE/install.lock"
  flock 8
  export KUBENPU_INSTALL_LOCKED=1
}

# The Debian mirror the scripts download from: $KUBENPU_DEBIAN_MIRROR, else the first URI the
# host's APT sources use for a Debian release suite (deb822 .sources or one-line sources.list), so
# a host behind a local mirror needs no edit. The repo names no mirror host. KUBENPU_APT_ETC
# (default /etc/apt) lets tests point it at fixtures.
debian_mirror() {
  if [[ -n ${KUBENPU_DEBIAN_MIRROR:-} ]]; then echo "${KUBENPU_DEBIAN_MIRROR%/}"; return; fi
  local etc=${KUBENPU_APT_ETC:-/etc/apt}
  local suites='^(buster|bullseye|bookworm|trixie|forky|duke|sid|oldstable|stable|testing|unstable)'
  local uri
  uri=$({
    # deb822: one "URI SUITE" line per pair of a stanza (stanzas are blank-line separated).
    for f in "$etc"/sources.list.d/*.sources; do
      [[ -e $f ]] && awk -v RS= '!/(^|\n)Enabled: *no/ {
          n = split($0, lines, "\n"); uris = ""; suites = ""
          for (i = 1; i <= n; i++) {
            if (lines[i] ~ /^URIs:/) uris = substr(lines[i], 6)
            if (lines[i] ~ /^Suites:/) suites = substr(lines[i], 8)
          }
          nu = split(uris, u, " "); ns = split(suites, s, " ")
          for (i = 1; i <= nu; i++) for (j = 1; j <= ns; j++) print u[i], s[j]
        }' "$f"
    done
    # One-line style: deb [options] URI SUITE COMPONENT...
    cat "$etc"/sources.list "$etc"/sources.list.d/*.list 2>/dev/null |
      sed -n 's/^deb[[:space:]]\+\(\[[^]]*\][[:space:]]\+\)\?//p'
  } | awk -v re="$suites(-updates|-backports)?\$" '$2 ~ re {print $1; exit}')
  if [[ -z $uri ]]; then
    echo "env.sh: no Debian mirror in the host's APT sources; set KUBENPU_DEBIAN_MIRROR" >&2
    return 1
  fi
  echo "${uri%/}"
}

# A private APT configuration that sees bookworm, trixie, sid and the backports,
# so we can download kernels and tools from any of them without touching the host's APT.
# Refreshed daily, or at once when the mirror changes.
apt_private_update() {
  local dir=$KUBENPU_CACHE/apt
  local stamp=$dir/updated
  local mirror sources suite
  mirror=$(debian_mirror)
  for suite in bookworm bookworm-backports trixie trixie-backports sid; do
    sources+="deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $mirror $suite main"$'\n'
  done
  if [[ -e $stamp && -z $(find "$stamp" -mmin +1440) &&
        $(cat "$dir/sources.list" 2>/dev/null) == "${sources%$'\n'}" ]]; then
    return 0
  fi
  mkdir -p "$dir"/{lists/partial,archives/partial,etc/preferences.d,etc/apt.conf.d}
  printf '%s' "$sources" >"$dir/sources.list"
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
host_install() (
  install_lock
  local missing=()
  for p in "$@"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
  ((${#missing[@]})) || return 0
  [[ -e /var/lib/apt/lists/lock && -n $(ls /var/lib/apt/lists/*Packages* 2>/dev/null) ]] || apt-get update -q >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null
)
