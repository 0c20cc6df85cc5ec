module tuna.test/gateway-api-crds

go 1.26.8

require sigs.k8s.io/gateway-api v1.6.1
