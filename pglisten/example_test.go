package pglisten_test

import (
	"context"
	"log"
	"os"

	"github.com/pgsse/pgsse/pglisten"
)

// A worker process that shares the host's pgsse LISTEN session through the hub, and falls back
// to a session of its own for good if pgsse goes away. Run next to `pgsse serve --hub-socket
// $PGSSE_HUB_SOCKET` (what `make run` starts), then `psql "$DATABASE_URL" -c "NOTIFY jobs, 'hi'"`.
func ExampleNewFailover() {
	l, err := pglisten.NewFailover(pglisten.FailoverConfig{
		Hub:    pglisten.HubConfig{Socket: os.Getenv("PGSSE_HUB_SOCKET")},
		Direct: pglisten.Config{DSN: os.Getenv("DATABASE_URL")}, // used only after a switch
	})
	if err != nil {
		log.Fatal(err) // a configuration that cannot work (bad DSN, no socket path)
	}
	defer l.Close()
	// Listen returns once the LISTEN is live: every NOTIFY committed after it reaches Events.
	if err := l.Listen(context.Background(), "jobs"); err != nil {
		log.Fatal(err)
	}
	for ev := range l.Events() {
		switch ev.Kind {
		case pglisten.KindNotification:
			log.Printf("%s: %s", ev.Channel, ev.Payload)
		case pglisten.KindDown:
			log.Print("LISTEN session lost; notifications may be missed until the resync")
		case pglisten.KindResync:
			// Notifications on ev.Channel ("" = all channels) may have been missed, e.g. across
			// a switch from the hub to the worker's own session: re-read the state they announce.
			log.Printf("resync %q", ev.Channel)
		}
	}
}
