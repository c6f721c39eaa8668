// Command golang is a batch handler for Hopper (consumer.batch): one POST
// carries many messages, and the answer settles each one on its own.
// Standard library only.
//
//	PORT=8080 go run ./examples/batch/golang
package main

import (
	"cmp"
	"encoding/json"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"
)

type entry struct {
	ID   string          `json:"id"`
	Data json.RawMessage `json:"data"` // absent when the body is not JSON (then data_base64)
}

type result struct {
	ID     string `json:"id"`
	Status int    `json:"status"`
	Error  string `json:"error,omitempty"`
}

// handle processes one message. Its status settles it as if it had come
// alone: 2xx acks it, 422 (a 4xx) dead-letters it, a 5xx retries it.
func handle(e entry) result {
	var order struct {
		Qty int `json:"qty"`
	}
	if json.Unmarshal(e.Data, &order) != nil || order.Qty <= 0 {
		return result{ID: e.ID, Status: http.StatusUnprocessableEntity, Error: "qty must be a positive integer"}
	}
	return result{ID: e.ID, Status: http.StatusOK}
}

func main() {
	http.HandleFunc("POST /", func(w http.ResponseWriter, r *http.Request) {
		var batch struct {
			Entries []entry `json:"entries"`
		}
		if err := json.NewDecoder(r.Body).Decode(&batch); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		results := make([]result, len(batch.Entries))
		for i, e := range batch.Entries {
			results[i] = handle(e)
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string][]result{"results": results}) // fails only when Hopper hung up
	})
	ln, err := net.Listen("tcp", "127.0.0.1:"+cmp.Or(os.Getenv("PORT"), "8080"))
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("listening on", ln.Addr())
	log.Fatal(http.Serve(ln, nil))
}
