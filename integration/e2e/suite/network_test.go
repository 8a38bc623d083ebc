// The suite this project runs upstream's Services tests with: Kubernetes' e2e
// framework (k8s.io/kubernetes/test/e2e, with its setup and reporting) and the
// network tests (test/e2e/network), without the other SIGs' tests that e2e.test
// also holds. The selection runs none of those, and they are most of what a
// first build of e2e.test compiles. Flags and embedded files are e2e.test's, and
// so is the suite's name, which the selection's patterns match.
//
// integration/e2e/build.sh builds it as e2e.test, in the module that
// integration/k8s/build.sh writes.
package networke2e

import (
	"flag"
	"fmt"
	"os"
	"testing"

	"k8s.io/component-base/version"
	conformancetestdata "k8s.io/kubernetes/test/conformance/testdata"
	"k8s.io/kubernetes/test/e2e"
	"k8s.io/kubernetes/test/e2e/framework"
	"k8s.io/kubernetes/test/e2e/framework/config"
	"k8s.io/kubernetes/test/e2e/framework/testfiles"
	e2etestingmanifests "k8s.io/kubernetes/test/e2e/testing-manifests"
	testfixtures "k8s.io/kubernetes/test/fixtures"

	// The feature and label names, defined before any test uses them.
	_ "k8s.io/kubernetes/test/e2e/feature"
	// The tests: [sig-network] Services, dual stack, Traffic Distribution,
	// Topology Hints and the rest of sig-network's.
	_ "k8s.io/kubernetes/test/e2e/network"

	// The framework's hooks, as e2e.test sets them: what it logs of a failed
	// test, the metrics it gathers, the nodes it waits for.
	_ "k8s.io/kubernetes/test/e2e/framework/debug/init"
	_ "k8s.io/kubernetes/test/e2e/framework/metrics/init"
	_ "k8s.io/kubernetes/test/e2e/framework/node/init"
	_ "k8s.io/kubernetes/test/utils/format"
)

func TestMain(m *testing.M) {
	showVersion := flag.Bool("version", false, "print the version and exit")
	config.CopyFlags(config.Flags, flag.CommandLine)
	framework.RegisterCommonFlags(flag.CommandLine)
	framework.RegisterClusterFlags(flag.CommandLine)
	flag.Parse()
	if *showVersion {
		fmt.Println(version.Get())
		os.Exit(0)
	}
	if flag.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "unknown arguments: %v\n", flag.Args())
		os.Exit(1)
	}
	// Manifests and fixtures some tests read, from the files compiled in.
	testfiles.AddFileSource(e2etestingmanifests.GetE2ETestingManifestsFS())
	testfiles.AddFileSource(testfixtures.GetTestFixturesFS())
	testfiles.AddFileSource(conformancetestdata.GetConformanceTestdataFS())
	framework.AfterReadingAllFlags(&framework.TestContext)
	os.Exit(m.Run())
}

func TestE2E(t *testing.T) {
	e2e.RunE2ETests(t)
}
