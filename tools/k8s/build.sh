#!/usr/bin/env bash
# Builds the test control plane (`make k8s-tools`) into .k8s/ from the Go module proxy, at the
# versions pinned by the go.mod/go.sum of each folder here:
#   kubernetes/  kube-apiserver, kube-controller-manager, kube-scheduler, kubectl (k8s.io/kubernetes)
#   etcd/        etcd (go.etcd.io/etcd/server/v3)
#   kwok/        kwok (sigs.k8s.io/kwok): simulated nodes and pods
#   kueue/       Kueue's controller manager (sigs.k8s.io/kueue), plus its CRDs and webhooks
#   helm/        the helm CLI (helm.sh/helm/v3)
#   coredns/     CoreDNS, which resolves Service names for the pods the node agent runs
# One folder per tool, so that each builds against the Kubernetes libraries it was released with.
#   prometheus/  Prometheus with its Kubernetes service discovery (Debian's build has none)
# A binary is rebuilt only when its folder's go.mod/go.sum or its build flags change (a stamp
# beside it holds their hash); the Go build and module caches make a rebuild cheap.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
out=${K8S_TOOLS_DIR:-$(cd "$here/../.." && pwd)/.k8s}
mkdir -p "$out/bin"
export GOFLAGS="${GOFLAGS:--buildvcs=false} -mod=readonly"
export CGO_ENABLED=0

k8s_version=$(awk '$1 == "require" && $2 == "k8s.io/kubernetes" {print $3}' "$here/kubernetes/go.mod")
module_version() {  # module_version DIR MODULE: the version DIR's go.mod requires
	awk -v m="$2" '($1 == m) {print $2} ($1 == "require" && $2 == m) {print $3}' "$here/$1/go.mod" | head -1
}
stamp_of() {  # stamp_of DIR PACKAGE LDFLAGS [TAGS]
	{ cat "$here/$1/go.mod" "$here/$1/go.sum"; echo "$2 $3${4:+ tags=$4}"; } | sha256sum | cut -c1-16
}

# build DIR NAME PACKAGE [LDFLAGS [TAGS]]
build() {
	local dir=$1 name=$2 package=$3 ldflags=${4:-} tags=${5:-}
	local stamp; stamp=$(stamp_of "$dir" "$package" "$ldflags" "$tags")
	if [ -x "$out/bin/$name" ] && [ "$(cat "$out/bin/.$name.stamp" 2>/dev/null)" = "$stamp" ]; then
		return
	fi
	echo "k8s-tools: building $name ($package)" >&2
	local start=$SECONDS
	(cd "$here/$dir" && go build -trimpath -tags "$tags" -ldflags "-s -w $ldflags" -o "$out/bin/$name" "$package")
	echo "$stamp" > "$out/bin/.$name.stamp"
	echo "k8s-tools: $name built in $((SECONDS - start)) s" >&2
}

# kubectl, helm and Kueue compare versions with the API server's, so every binary says its own.
kube_ldflags=""
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
	minor=$(echo "$k8s_version" | cut -d. -f2)
	kube_ldflags+=" -X $pkg.gitVersion=$k8s_version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor -X $pkg.gitTreeState=clean"
done
for cmd in kube-apiserver kube-controller-manager kube-scheduler kubectl; do
	build kubernetes "$cmd" "k8s.io/kubernetes/cmd/$cmd" "$kube_ldflags"
done
build etcd etcd go.etcd.io/etcd/server/v3
kwok_version=$(module_version kwok sigs.k8s.io/kwok)
build kwok kwok sigs.k8s.io/kwok/cmd/kwok "-X sigs.k8s.io/kwok/pkg/consts.Version=${kwok_version#v}"
kueue_version=$(module_version kueue sigs.k8s.io/kueue)
build kueue kueue sigs.k8s.io/kueue/cmd/kueue "-X sigs.k8s.io/kueue/pkg/version.GitVersion=$kueue_version"
helm_version=$(module_version helm helm.sh/helm/v3)
build helm helm helm.sh/helm/v3/cmd/helm "-X helm.sh/helm/v3/internal/version.version=$helm_version"
build coredns coredns github.com/coredns/coredns
# Only the Kubernetes discovery: the cloud SDKs the others pull in would triple the build.
build prometheus prometheus github.com/prometheus/prometheus/cmd/prometheus "" "remove_all_sd,enable_kubernetes_sd"

# Kueue's CRDs and webhook configurations, from the same module version as its binary.
kueue_src=$(cd "$here/kueue" && go mod download -json sigs.k8s.io/kueue | sed -n 's/.*"Dir": "\(.*\)",/\1/p')
mkdir -p "$out/kueue/crds"
cp "$kueue_src"/config/components/crd/bases/*.yaml "$out/kueue/crds/"
cp "$kueue_src"/config/components/webhook/manifests.yaml "$out/kueue/webhooks.yaml"
chmod -R u+w "$out/kueue"
echo "$kueue_version" > "$out/kueue/VERSION"

# kwok's own stages (what its nodes and pods go through: ready at once, heartbeats on a Lease,
# deleted when asked), from the same module version as its binary; `kwok --config` reads them.
kwok_src=$(cd "$here/kwok" && go mod download -json sigs.k8s.io/kwok | sed -n 's/.*"Dir": "\(.*\)",/\1/p')
mkdir -p "$out/kwok"
{
	for stage in node/fast/node-initialize node/heartbeat-with-lease/node-heartbeat-with-lease \
		pod/fast/pod-ready pod/fast/pod-complete pod/fast/pod-delete; do
		echo "---"
		cat "$kwok_src/kustomize/stage/$stage.yaml"
	done
} > "$out/kwok/stages.yaml"
