//go:build tools

// The echo backend of the suite's base manifests, built from the same pinned
// module by scripts/conformance.sh (go build sigs.k8s.io/gateway-api/conformance/echo-basic).
package tools

import _ "sigs.k8s.io/gateway-api/conformance/echo-basic"
