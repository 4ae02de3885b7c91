#!/usr/bin/env bash
# Builds the Debian package (target/debian/longhaul_*.deb) with cargo-deb and
# inspects it: the files it holds (dpkg-deb -c), its control data, and
# lintian's verdict where lintian is installed.
#
#   scripts/build_deb.sh            # installs cargo-deb (cargo install) if missing
#
# The package: /usr/bin/longhaul, a manual page per command, bash/zsh/fish
# completions, the hardened unit (lib/systemd/system/longhaul-server.service,
# run as the system user `longhaul` that postinst makes; never enabled or
# started by the package), /etc/longhaul/server.toml (a conffile), and the
# README, SECURITY and an example client config under /usr/share/doc.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v cargo-deb >/dev/null || cargo install cargo-deb --locked
cargo build --release --locked -p longhaul
LH=target/release/longhaul
out=target/packaging
rm -rf "$out" && mkdir -p "$out/man" "$out/completions"
"$LH" man --dir "$out/man"
gzip -9n "$out"/man/*.1
"$LH" completions bash >"$out/completions/longhaul"
"$LH" completions zsh >"$out/completions/_longhaul"
"$LH" completions fish >"$out/completions/longhaul.fish"
# The unit in contrib/ is for a binary installed by hand under a dynamic
# user; the package's runs /usr/bin/longhaul as its own system user (which
# can then own the keys in /etc/longhaul).
sed -e 's|/usr/local/bin/longhaul|/usr/bin/longhaul|' \
    -e 's|^DynamicUser=yes|User=longhaul\nGroup=longhaul|' \
    -e '/^# systemd unit for a longhaul server. Install:/,/^#   systemctl daemon-reload/d' \
    -e 's|^# A user of its own, made for the service; it reads /etc/longhaul through$|# The system user the package made; it reads /etc/longhaul through|' \
    -e 's|^# the group systemd gives it (chgrp the files to it, or make them readable).$|# its group (chgrp the key to longhaul, mode 640).|' \
    contrib/longhaul-server.service >"$out/longhaul-server.service"
grep -q '^User=longhaul$' "$out/longhaul-server.service"
cargo deb -p longhaul --no-build --strip
deb=$(ls -t target/debian/longhaul_*.deb | head -1)
echo "== $deb"
dpkg-deb -I "$deb"
dpkg-deb -c "$deb"
if command -v lintian >/dev/null; then
    # Not fatal: the verdict is printed for whoever builds the package.
    lintian --no-tag-display-limit "$deb" || true
else
    echo "(lintian not installed: apt-get install lintian to check the package)"
fi
