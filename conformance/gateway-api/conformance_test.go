// The official Gateway API conformance suite, unmodified: upstream's own
// entry point (conformance/conformance_test.go of the module), run against
// tuna-operator by scripts/conformance.sh, which passes the flags
// (-gateway-class, -conformance-profiles, -report-output, ...). No feature
// flags are passed, so the suite infers the supported features from the
// GatewayClass's status.supportedFeatures.
package conformance_test

import (
	"testing"

	"sigs.k8s.io/gateway-api/conformance"
)

func TestConformance(t *testing.T) {
	conformance.RunConformance(t)
}
