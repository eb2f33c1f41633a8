#!/bin/sh
# TEST DOUBLE of the official k3s install script (https://get.k3s.io): no k3s release can
# be downloaded here. Installs a fake `k3s` binary, writes a fake kubeconfig, "starts" the
# service through the systemctl double, and logs what it did to $K3S_DOUBLE_ROOT/calls.
#
# Environment:
#   K3S_DOUBLE_ROOT   call log and service state (default /var/lib/k3s-double, for a test
#                     machine where the installer runs as root over SSH)
#   K3S_DOUBLE_BIN    where `k3s` goes and the systemctl double is (default
#                     $K3S_DOUBLE_ROOT/bin when K3S_DOUBLE_ROOT is set, else /usr/local/bin)
#   K3S_DOUBLE_INSTALL_SECS  seconds the "install" takes (default: the number in
#                     $K3S_DOUBLE_ROOT/install-secs if that file exists, else 0)
#   GPUPROV_K3S_CONFIG_DIR   where the kubeconfig goes (default /etc/rancher/k3s, as k3s)
set -eu
if [ -n "${K3S_DOUBLE_ROOT:-}" ]; then
    ROOT=$K3S_DOUBLE_ROOT
    BIN=${K3S_DOUBLE_BIN:-$ROOT/bin}
else
    ROOT=/var/lib/k3s-double
    BIN=${K3S_DOUBLE_BIN:-/usr/local/bin}
fi
CONFIG_DIR=${GPUPROV_K3S_CONFIG_DIR:-/etc/rancher/k3s}
mkdir -p "$ROOT" "$BIN" "$CONFIG_DIR"
echo "install-start version=${INSTALL_K3S_VERSION:-}" >>"$ROOT/calls"
secs=${K3S_DOUBLE_INSTALL_SECS:-}
if [ -z "$secs" ] && [ -f "$ROOT/install-secs" ]; then secs=$(cat "$ROOT/install-secs"); fi
sleep "${secs:-0}"
printf '#!/bin/sh\necho "k3s double $*"\n' >"$BIN/k3s"
chmod +x "$BIN/k3s"
# The shape of the kubeconfig k3s writes (one cluster, user and context named `default`,
# mode 0600). The *-data values are base64 of marker text, NOT certificates or keys.
(
    umask 077
    cat >"$CONFIG_DIR/k3s.yaml" <<'YAML'
# TEST DOUBLE: written by tests/doubles/k3s-install-double.sh, not by k3s.
apiVersion: v1
clusters:
- cluster:
    certificate-authority-data: VEVTVCBET1VCTEUgQ0EgLSBub3QgYSBjZXJ0aWZpY2F0ZQo=
    server: https://127.0.0.1:6443
  name: default
contexts:
- context:
    cluster: default
    user: default
  name: default
current-context: default
kind: Config
preferences: {}
users:
- name: default
  user:
    client-certificate-data: VEVTVCBET1VCTEUgY2xpZW50IGNlcnQgLSBub3QgYSBjZXJ0aWZpY2F0ZQo=
    client-key-data: VEVTVCBET1VCTEUgY2xpZW50IGtleSAtIG5vdCBhIGtleQo=
YAML
)
echo "install-end" >>"$ROOT/calls"
"$BIN/systemctl" start k3s
