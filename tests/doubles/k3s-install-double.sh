#!/bin/sh
# TEST DOUBLE of the official k3s install script (https://get.k3s.io): no k3s release can
# be downloaded here. Installs a fake `k3s` binary into $K3S_DOUBLE_ROOT/bin, "starts" the
# service through the systemctl double, and logs what it did to $K3S_DOUBLE_ROOT/calls.
set -eu
: "${K3S_DOUBLE_ROOT:?}"
echo "install-start version=${INSTALL_K3S_VERSION:-}" >>"$K3S_DOUBLE_ROOT/calls"
sleep "${K3S_DOUBLE_INSTALL_SECS:-0}"
printf '#!/bin/sh\necho "k3s double $*"\n' >"$K3S_DOUBLE_ROOT/bin/k3s"
chmod +x "$K3S_DOUBLE_ROOT/bin/k3s"
echo "install-end" >>"$K3S_DOUBLE_ROOT/calls"
"$K3S_DOUBLE_ROOT/bin/systemctl" start k3s
