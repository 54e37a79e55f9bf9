// Command dockerdb is the test harness's last resort: when no local
// database server answers, internal/pgtest runs it (go run, from this
// directory) to start a PostgreSQL container through ory/dockertest. It
// prints the server's URL on one line of standard output, keeps the
// container until its standard input closes (the test binary ended), then
// removes it; the engine also expires it after 15 minutes.
//
// It is a module of its own so that the library's go.mod, and every user's
// module graph, carries no Docker client.
//
//	go run . postgres
package main

import (
	"database/sql"
	"fmt"
	"io"
	"os"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib"
	"github.com/ory/dockertest/v3"
	"github.com/ory/dockertest/v3/docker"
)

func main() {
	if len(os.Args) != 2 || os.Args[1] != "postgres" {
		fmt.Fprintln(os.Stderr, "usage: dockerdb postgres")
		os.Exit(2)
	}
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "dockerdb:", err)
		os.Exit(1)
	}
}

func run() error {
	pool, err := dockertest.NewPool("")
	if err != nil {
		return err
	}
	if err := pool.Client.Ping(); err != nil {
		return fmt.Errorf("no Docker engine: %w", err)
	}
	res, err := pool.RunWithOptions(&dockertest.RunOptions{
		Repository: "postgres", Tag: "15",
		Env: []string{"POSTGRES_HOST_AUTH_METHOD=trust", "POSTGRES_DB=test"},
	}, func(hc *docker.HostConfig) { hc.AutoRemove = true })
	if err != nil {
		return err
	}
	defer pool.Purge(res)
	_ = res.Expire(900) // the engine removes it even if this process dies
	u := fmt.Sprintf("postgres://postgres@%s/test?sslmode=disable", res.GetHostPort("5432/tcp"))
	pool.MaxWait = 60 * time.Second
	if err := pool.Retry(func() error {
		db, err := sql.Open("pgx", u)
		if err != nil {
			return err
		}
		defer db.Close()
		return db.Ping()
	}); err != nil {
		return err
	}
	fmt.Println(u)
	_, _ = io.Copy(io.Discard, os.Stdin) // until the test binary ends
	return nil
}
