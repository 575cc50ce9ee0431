# Helpers to build OCI images FROM scratch with buildah, without pulling any base image: a root
# file system is staged in a directory (programs with the shared libraries they load, taken from
# this machine's Debian packages), then a Containerfile copies it in. Sourced by .ci/image (the
# operator's image) and tests/peers/setup (the images the real-node tests run).
#
#   oci_stage_elf ROOTFS FILE [DEST]   copy FILE (to DEST inside ROOTFS) and every library it loads
#   oci_stage_base ROOTFS              /etc/passwd, /etc/group (65532 nonroot), nsswitch, CA bundle
#   oci_build CONTEXT CONTAINERFILE NAME:TAG ARCHIVE
#                                      build with buildah (timestamps 0, storage of its own) and
#                                      write an OCI archive; prints the manifest digest
#
# Reproducible: every file's time is 0 in the layer (buildah --timestamp 0), the staged modes are
# fixed, and the image config carries no build time or host name, so the same inputs give the
# same digest.

oci_die() { printf 'oci: error: %s\n' "$*" >&2; exit 1; }

# The libraries `ldd` resolves for an ELF file (the dynamic loader included), one per line.
oci_libs() {
  ldd "$1" 2>/dev/null | awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\// { print $1 }' | sort -u
}

# Copies a file into the root file system at the same path (or DEST), with mode 0755.
oci_put() {
  local rootfs=$1 src=$2 dest=${3:-$2}
  mkdir -p "$rootfs$(dirname "$dest")"
  cp -L "$src" "$rootfs$dest"
  chmod 0755 "$rootfs$dest"
}

oci_stage_elf() {
  local rootfs=$1 file=$2 dest=${3:-$2}
  [ -f "$file" ] || oci_die "$file does not exist"
  oci_put "$rootfs" "$file" "$dest"
  local lib
  for lib in $(oci_libs "$file"); do
    [ -e "$rootfs$lib" ] || oci_put "$rootfs" "$lib"
  done
}

oci_stage_base() {
  local rootfs=$1
  mkdir -p "$rootfs/etc/ssl/certs" "$rootfs/tmp"
  printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' \
    >"$rootfs/etc/passwd"
  printf 'root:x:0:\nnonroot:x:65532:\n' >"$rootfs/etc/group"
  # /etc/hosts first: a pod's hostAliases and the kubelet's entries win over DNS.
  printf 'hosts: files dns\n' >"$rootfs/etc/nsswitch.conf"
  [ -f /etc/ssl/certs/ca-certificates.crt ] || oci_die "no CA bundle: install Debian's ca-certificates"
  cp /etc/ssl/certs/ca-certificates.crt "$rootfs/etc/ssl/certs/"
  chmod 1777 "$rootfs/tmp"
  find "$rootfs/etc" -type f -exec chmod 0644 {} +
}

# buildah with a storage of its own (vfs: it works wherever buildah does), removed afterwards.
oci_build() {
  local context=$1 containerfile=$2 name=$3 archive=$4
  command -v buildah >/dev/null || oci_die "buildah is missing (Debian: apt-get install buildah)"
  local store
  store=$(mktemp -d "${TMPDIR:-/tmp}/oci-store.XXXXXX")
  local b=(buildah --root "$store/root" --runroot "$store/run" --storage-driver vfs)
  # Directories are 0755 and owned by root whatever the umask or checkout did.
  find "$context" -type d ! -path "*/tmp" -exec chmod 0755 {} +
  mkdir -p "$(dirname "$archive")"
  rm -f "$archive"
  if ! "${b[@]}" build --quiet --timestamp 0 --identity-label=false --layers=false \
      -f "$containerfile" -t "$name" "$context" >"$store/build.log" 2>&1; then
    cat "$store/build.log" >&2
    rm -rf "$store"
    oci_die "buildah build of $name failed"
  fi
  "${b[@]}" push --quiet "$name" "oci-archive:$archive:$name" >"$store/push.log" 2>&1 || {
    cat "$store/push.log" >&2
    rm -rf "$store"
    oci_die "buildah push of $name to $archive failed"
  }
  rm -rf "$store"
  oci_digest "$archive"
}

# The digest of the image manifest in an OCI archive (what a registry would call the image).
oci_digest() {
  tar -xOf "$1" index.json | python3 -c 'import json,sys; print(json.load(sys.stdin)["manifests"][0]["digest"])'
}
