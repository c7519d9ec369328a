// The kubelet's downward-API annotations file, as k8s.io/kubernetes pkg/fieldpath FormatMap writes
// it: sorted keys, `key=%q` per line, no trailing newline. Reads a JSON map on stdin (tests only).
package main

import (
	"encoding/json"
	"fmt"
	"os"
	"sort"
	"strings"
)

func main() {
	var m map[string]string
	if err := json.NewDecoder(os.Stdin).Decode(&m); err != nil {
		panic(err)
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var s string
	for _, k := range keys {
		s += fmt.Sprintf("%v=%q\n", k, m[k])
	}
	fmt.Print(strings.TrimSuffix(s, "\n"))
}
