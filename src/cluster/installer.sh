#!/bin/sh
# gpuprov k3s installer. Shipped inside the gpuprov binary (src/cluster/installer.sh,
# environment built by src/cluster/installer.rs); design 4.5 of
# provisioning-state-machines.md.
#
# Makes this host a single-node k3s cluster, with the GPU schedulable as nvidia.com/gpu
# on a GPU host. Idempotent: every step looks before it acts, so the same script runs at
# boot (cloud-init or a startup script) and again over SSH, even at the same time: runs
# serialise on a host-wide flock. Progress and outcome are in
# $GPUPROV_STATE_DIR/k3s-install.status (state=running|done|failed, key=value lines).
#
# GPU path order: driver check -> NVIDIA container toolkit -> k3s (k3s registers only the
# nvidia runtimes that exist when it starts, so it is restarted if the toolkit arrives
# after it) -> the containerd config k3s generated must list the nvidia runtime ->
# device plugin manifest.
#
# Environment (all optional):
#   GPUPROV_TLS_SANS               comma-separated TLS SANs for the API certificate
#   GPUPROV_TLS_SAN_FROM_METADATA  1: also add the public IP from the AWS/GCP metadata service
#   GPUPROV_GPU                    required | auto | off (default auto)
#   GPUPROV_K3S_INSTALL_URL        k3s install script: URL, file:// URL or absolute path
#                                  (default https://get.k3s.io)
#   GPUPROV_K3S_VERSION            k3s release for the install script (INSTALL_K3S_VERSION);
#                                  empty: the install script's default (stable channel)
#   GPUPROV_NVIDIA_REPO_URL        NVIDIA container toolkit package repository
#   GPUPROV_DEVICE_PLUGIN_IMAGE    NVIDIA device plugin image
#   GPUPROV_STATE_DIR              default /var/lib/gpuprov
#   GPUPROV_K3S_CONFIG_DIR         default /etc/rancher/k3s
#   GPUPROV_K3S_DATA_DIR           default /var/lib/rancher/k3s
#   GPUPROV_LOCK_TIMEOUT           seconds to wait for another run's lock (default 1800)
#   GPUPROV_WAIT_SECS              seconds to wait for the driver, k3s and its containerd
#                                  config (default 300 each)
#
# Exit status: 0 done, 1 failed (reason in the status file), 75 lock not acquired in time.

set -eu
set -f
umask 022

STATE_DIR=${GPUPROV_STATE_DIR:-/var/lib/gpuprov}
STATUS_FILE=$STATE_DIR/k3s-install.status
LOCK_FILE=$STATE_DIR/k3s-install.lock
INSTALLED_MARK=$STATE_DIR/k3s-installed
CONFIG_DIR=${GPUPROV_K3S_CONFIG_DIR:-/etc/rancher/k3s}
CONFIG_FILE=$CONFIG_DIR/config.yaml
DATA_DIR=${GPUPROV_K3S_DATA_DIR:-/var/lib/rancher/k3s}
CONTAINERD_CONFIG=$DATA_DIR/agent/etc/containerd/config.toml
MANIFEST=$DATA_DIR/server/manifests/gpuprov-nvidia-device-plugin.yaml
INSTALL_URL=${GPUPROV_K3S_INSTALL_URL:-https://get.k3s.io}
K3S_VERSION=${GPUPROV_K3S_VERSION:-}
TLS_SANS=${GPUPROV_TLS_SANS:-}
SAN_FROM_METADATA=${GPUPROV_TLS_SAN_FROM_METADATA:-0}
GPU=${GPUPROV_GPU:-auto}
NVIDIA_REPO_URL=${GPUPROV_NVIDIA_REPO_URL:-https://nvidia.github.io/libnvidia-container}
DEVICE_PLUGIN_IMAGE=${GPUPROV_DEVICE_PLUGIN_IMAGE:-nvcr.io/nvidia/k8s-device-plugin:v0.17.1}
LOCK_TIMEOUT=${GPUPROV_LOCK_TIMEOUT:-1800}
WAIT_SECS=${GPUPROV_WAIT_SECS:-300}
SERVICE=k3s

STEP=lock
GPU_PATH=0
CONFIG_CHANGED=0
TOOLKIT_INSTALLED=0
RESTARTED=0
REPORTED=0

log() {
    printf 'gpuprov-k3s: %s\n' "$*" >&2
}

# write_status STATE [REASON]: replaces the status file atomically (temp file + rename),
# so a reader (the boot probe) never sees half of it.
write_status() {
    tmp=$STATUS_FILE.tmp.$$
    {
        printf 'state=%s\n' "$1"
        printf 'step=%s\n' "$STEP"
        printf 'updated=%s\n' "$(date +%s)"
        printf 'pid=%s\n' "$$"
        printf 'gpu=%s\n' "$GPU_PATH"
        printf 'config_changed=%s\n' "$CONFIG_CHANGED"
        printf 'restarted=%s\n' "$RESTARTED"
        if [ -n "${2:-}" ]; then
            printf 'reason=%s\n' "$(printf '%s' "$2" | tr '\n' ' ')"
        fi
    } >"$tmp"
    mv -f "$tmp" "$STATUS_FILE"
}

fail() {
    log "error: $*"
    REPORTED=1
    write_status failed "$*" || true
    exit 1
}

on_exit() {
    rc=$?
    if [ "$rc" -ne 0 ] && [ "$REPORTED" = 0 ]; then
        write_status failed "step $STEP exited with status $rc" || true
    fi
}

# fetch SOURCE DEST: an http(s)/file URL (curl, else wget) or an absolute path.
fetch() {
    case $1 in
        /*) cp "$1" "$2" ;;
        *)
            if command -v curl >/dev/null 2>&1; then
                curl -fsSL --retry 5 --retry-delay 2 -o "$2" "$1"
            elif command -v wget >/dev/null 2>&1; then
                wget -q -O "$2" "$1"
            else
                fail "neither curl nor wget is installed to download $1"
            fi
            ;;
    esac
}

# wait_for SECONDS CMD...: runs CMD every 2 s until it succeeds; fails after SECONDS.
wait_for() {
    limit=$1
    shift
    waited=0
    until "$@"; do
        if [ "$waited" -ge "$limit" ]; then
            return 1
        fi
        sleep 2
        waited=$((waited + 2))
    done
}

valid_san() {
    case $1 in
        '' | *[!A-Za-z0-9.:*-]*) return 1 ;;
        *) return 0 ;;
    esac
}

# The public IPv4 from the AWS (IMDSv2) or GCP metadata service; nothing when neither
# answers within 2 s.
metadata_public_ip() {
    command -v curl >/dev/null 2>&1 || return 0
    token=$(curl -fsS -m 2 -X PUT -H 'X-aws-ec2-metadata-token-ttl-seconds: 60' \
        http://169.254.169.254/latest/api/token 2>/dev/null) || token=
    if [ -n "$token" ]; then
        if curl -fsS -m 2 -H "X-aws-ec2-metadata-token: $token" \
            http://169.254.169.254/latest/meta-data/public-ipv4 2>/dev/null; then
            return 0
        fi
    fi
    curl -fsS -m 2 -H 'Metadata-Flavor: Google' \
        http://metadata.google.internal/computeMetadata/v1/instance/network-interfaces/0/access-configs/0/external-ip \
        2>/dev/null || true
}

gpu_visible() {
    command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU '
}

toolkit_present() {
    command -v nvidia-container-runtime >/dev/null 2>&1
}

k3s_installed() {
    [ -f "$INSTALLED_MARK" ] && command -v k3s >/dev/null 2>&1
}

k3s_active() {
    systemctl is-active --quiet "$SERVICE" 9>&-
}

nvidia_runtime_listed() {
    [ -f "$CONTAINERD_CONFIG" ] &&
        grep -Eq "runtimes[.][\"']?nvidia[\"']?[]]" "$CONTAINERD_CONFIG"
}

# NVIDIA's documented apt route ("Installing the NVIDIA Container Toolkit", With apt).
install_toolkit() {
    command -v apt-get >/dev/null 2>&1 ||
        fail "the NVIDIA container toolkit is missing and this host has no apt-get to install it"
    keyring=/usr/share/keyrings/nvidia-container-toolkit-keyring.gpg
    fetch "$NVIDIA_REPO_URL/gpgkey" "$STATE_DIR/nvidia-gpgkey"
    gpg --batch --yes --dearmor -o "$keyring" "$STATE_DIR/nvidia-gpgkey"
    fetch "$NVIDIA_REPO_URL/stable/deb/nvidia-container-toolkit.list" "$STATE_DIR/nvidia.list"
    sed "s#deb https://#deb [signed-by=$keyring] https://#g" "$STATE_DIR/nvidia.list" \
        >/etc/apt/sources.list.d/nvidia-container-toolkit.list
    # First boot often has unattended-upgrades holding the dpkg lock: wait for it.
    apt-get -o DPkg::Lock::Timeout=600 update
    DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y \
        nvidia-container-toolkit
    toolkit_present || fail "nvidia-container-toolkit installed but nvidia-container-runtime is not on PATH"
}

render_config() {
    printf '# Managed by gpuprov (installer.sh); rewritten on every install run.\n'
    printf 'write-kubeconfig-mode: "0600"\n'
    if [ -n "$SANS" ]; then
        printf 'tls-san:\n'
        old_ifs=$IFS
        IFS=,
        for s in $SANS; do
            printf '  - "%s"\n' "$s"
        done
        IFS=$old_ifs
    fi
    if [ "$GPU_PATH" = 1 ]; then
        printf 'default-runtime: nvidia\n'
    fi
}

render_device_plugin() {
    cat <<EOF
# Managed by gpuprov (installer.sh): NVIDIA device plugin, after NVIDIA's static
# deployments/static/nvidia-device-plugin.yml. k3s applies files in this directory.
apiVersion: apps/v1
kind: DaemonSet
metadata:
  name: nvidia-device-plugin-daemonset
  namespace: kube-system
spec:
  selector:
    matchLabels:
      name: nvidia-device-plugin-ds
  updateStrategy:
    type: RollingUpdate
  template:
    metadata:
      labels:
        name: nvidia-device-plugin-ds
    spec:
      tolerations:
        - key: nvidia.com/gpu
          operator: Exists
          effect: NoSchedule
      priorityClassName: system-node-critical
      containers:
        - name: nvidia-device-plugin-ctr
          image: "$DEVICE_PLUGIN_IMAGE"
          securityContext:
            allowPrivilegeEscalation: false
            capabilities:
              drop: ["ALL"]
          volumeMounts:
            - name: device-plugin
              mountPath: /var/lib/kubelet/device-plugins
      volumes:
        - name: device-plugin
          hostPath:
            path: /var/lib/kubelet/device-plugins
EOF
}

# replace_if_changed NEW DEST: moves NEW over DEST when they differ; returns 0 if it did.
replace_if_changed() {
    if [ -f "$2" ] && cmp -s "$1" "$2"; then
        rm -f "$1"
        return 1
    fi
    mv -f "$1" "$2"
    return 0
}

# --- lock -------------------------------------------------------------------------------

mkdir -p "$STATE_DIR"
command -v flock >/dev/null 2>&1 || {
    log "error: flock (util-linux) is not installed"
    exit 1
}
exec 9>>"$LOCK_FILE"
if ! flock -w "$LOCK_TIMEOUT" 9; then
    # Another run holds the lock and owns the status file: leave it alone.
    log "error: another install run held $LOCK_FILE for ${LOCK_TIMEOUT}s"
    exit 75
fi
trap on_exit EXIT
trap 'exit 130' INT TERM HUP
STEP=start
write_status running

# --- inputs -----------------------------------------------------------------------------

SANS=
old_ifs=$IFS
IFS=,
for s in $TLS_SANS; do
    [ -n "$s" ] || continue
    valid_san "$s" || fail "invalid TLS SAN '$s' in GPUPROV_TLS_SANS"
    SANS=${SANS:+$SANS,}$s
done
IFS=$old_ifs
if [ "$SAN_FROM_METADATA" = 1 ]; then
    STEP=metadata
    ip=$(metadata_public_ip)
    if valid_san "$ip"; then
        case ",$SANS," in
            *",$ip,"*) ;;
            *) SANS=${SANS:+$SANS,}$ip ;;
        esac
    else
        log "no public IP from the metadata service; gpuprov adds the SAN after boot"
    fi
fi

# --- GPU: driver, then container toolkit -------------------------------------------------

STEP=driver
case $GPU in
    off) GPU_PATH=0 ;;
    auto) if gpu_visible; then GPU_PATH=1; fi ;;
    required)
        GPU_PATH=1
        wait_for "$WAIT_SECS" gpu_visible ||
            fail "no NVIDIA GPU visible after ${WAIT_SECS}s: nvidia-smi -L lists none (driver not installed or not loaded)"
        ;;
    *) fail "GPUPROV_GPU must be required, auto or off, not '$GPU'" ;;
esac
write_status running

if [ "$GPU_PATH" = 1 ]; then
    STEP=toolkit
    if ! toolkit_present; then
        log "installing the NVIDIA container toolkit"
        install_toolkit
        TOOLKIT_INSTALLED=1
    fi
fi

# --- k3s config, install or restart -------------------------------------------------------

STEP=config
mkdir -p "$CONFIG_DIR"
render_config >"$CONFIG_FILE.gpuprov-new"
if replace_if_changed "$CONFIG_FILE.gpuprov-new" "$CONFIG_FILE"; then
    CONFIG_CHANGED=1
fi
write_status running

if ! k3s_installed; then
    STEP=k3s-install
    log "installing k3s from $INSTALL_URL"
    fetch "$INSTALL_URL" "$STATE_DIR/k3s-install.sh"
    INSTALL_K3S_VERSION=$K3S_VERSION sh "$STATE_DIR/k3s-install.sh" 9>&-
    : >"$INSTALLED_MARK"
elif [ "$CONFIG_CHANGED" = 1 ] || [ "$TOOLKIT_INSTALLED" = 1 ]; then
    STEP=k3s-restart
    log "restarting k3s (config changed: $CONFIG_CHANGED, toolkit installed: $TOOLKIT_INSTALLED)"
    systemctl restart "$SERVICE" 9>&-
    RESTARTED=1
elif ! k3s_active; then
    STEP=k3s-start
    systemctl start "$SERVICE" 9>&-
fi
STEP=k3s-active
wait_for "$WAIT_SECS" k3s_active || fail "k3s is not active ${WAIT_SECS}s after start"
write_status running

# --- GPU: containerd runtime, device plugin ----------------------------------------------

if [ "$GPU_PATH" = 1 ]; then
    STEP=containerd-runtime
    if ! wait_for "$WAIT_SECS" nvidia_runtime_listed; then
        if [ "$RESTARTED" = 0 ]; then
            # k3s started before the toolkit existed (an earlier, interrupted run).
            log "the nvidia runtime is not in k3s's containerd config: restarting k3s once"
            systemctl restart "$SERVICE" 9>&-
            RESTARTED=1
        fi
        wait_for "$WAIT_SECS" nvidia_runtime_listed ||
            fail "k3s's containerd config ($CONTAINERD_CONFIG) does not list the nvidia runtime"
    fi
    STEP=device-plugin
    mkdir -p "$(dirname "$MANIFEST")"
    render_device_plugin >"$MANIFEST.gpuprov-new"
    replace_if_changed "$MANIFEST.gpuprov-new" "$MANIFEST" || true
fi

STEP=finish
REPORTED=1
write_status "done"
log "done"
