package strictrate_test

import (
	"os"
	"regexp"
	"strings"
	"testing"
)

// The README's two commands are what a newcomer runs, and CI runs the second exactly: the row
// of "The two commands" that runs the tests names the command .ci/run runs, word for word, and
// the first is the bench.
func TestCIRunsTheREADMEsTestCommand(t *testing.T) {
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	section := regexp.MustCompile("(?s)## The two commands\n(.*?)\n## ").FindSubmatch(readme)
	if section == nil {
		t.Fatal("README.md has no section \"The two commands\"")
	}
	rows := regexp.MustCompile("(?m)^\\| [^|]+\\| `([^`]+)` \\|").FindAllSubmatch(section[1], -1)
	if len(rows) != 2 {
		t.Fatalf("\"The two commands\" has %d rows with a command, want 2", len(rows))
	}
	if bench := string(rows[0][1]); bench != "go run ./bench" {
		t.Errorf("the first command is %q, want go run ./bench", bench)
	}
	test := string(rows[1][1])
	ci, err := os.ReadFile(".ci/run")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(ci), "\n") {
		if line == test {
			return
		}
	}
	t.Fatalf(".ci/run has no line %q, the README's test command", test)
}
