# The upstream tests this project runs, in one place (sourced by run.sh): the
# tests of `[sig-network] Services`, skipped as kube-proxy's own kind job for
# nftables mode skips them (pull-kubernetes-e2e-kind-nftables in
# kubernetes/test-infra, config/jobs/kubernetes/sig-network/sig-network-kind.yaml),
# with `\[Serial\]` as kind's e2e-k8s.sh adds it to a parallel run. Ginkgo
# matches these against "Kubernetes e2e suite [sig-network] Services …", so
# they are not anchored.
# shellcheck disable=SC2034
E2E_FOCUS='\[sig-network\] Services '
skip_always='\[Serial\]|Alpha|Beta|LoadBalancer|Disruptive|Flaky'
E2E_SKIP="$skip_always|Networking-IPv6|IPv6DualStack|LocalhostNodePorts"
# The tests that need zones (--zones clusters, integration/kind/up.sh): how
# traffic follows a Service's trafficDistribution and topology hints, and the
# one Services test that skips itself with fewer than 3 schedulable nodes.
E2E_ZONES_FOCUS='\[sig-network\] Traffic Distribution |\[sig-network\] Topology Hints |\[sig-network\] Services should implement NodePort and HealthCheckNodePort correctly when ExternalTrafficPolicy changes'
# Upstream's dual-stack tests (--dual-stack clusters), skipped as the rest but
# for the family they test, and SCTP, which this kernel lacks.
E2E_DUAL_FOCUS='\[Feature:IPv6DualStack\]'
E2E_DUAL_SKIP="$skip_always|SCTPConnectivity"
# On IPv6-only clusters (--ipv6): the Services selection, skipped as upstream's
# IPv6 kind job skips it, the IPv4 tests in place of the IPv6 ones.
E2E_IPV6_SKIP="$skip_always|Networking-IPv4|IPv6DualStack|LocalhostNodePorts"
# The [Conformance] tests among them: what the test command runs.
E2E_CONFORMANCE_FOCUS='\[sig-network\] Services .*\[Conformance\]'
