module github.com/oncommit/oncommit/forward/rabbitmq

go 1.26.8

require (
	github.com/jackc/pgx/v5 v5.12.0
	github.com/oncommit/oncommit v0.0.0
)

require (
	github.com/DATA-DOG/go-sqlmock v1.5.2 // indirect
	github.com/jackc/pgio v1.0.0 // indirect
	github.com/jackc/pglogrepl v0.0.0-20251213150135-2e8d0df862c1 // indirect
	github.com/jackc/pgpassfile v1.0.0 // indirect
	github.com/jackc/pgservicefile v0.0.0-20240606120523-5a60cdf6a761 // indirect
	github.com/jackc/puddle/v2 v2.2.3 // indirect
	github.com/lib/pq v1.12.3 // indirect
	go.yaml.in/yaml/v3 v3.0.6 // indirect
	golang.org/x/sync v0.25.0 // indirect
	golang.org/x/text v0.44.0 // indirect
)

require (
	github.com/oklog/ulid/v2 v2.1.2 // indirect
	github.com/rabbitmq/amqp091-go v1.16.0
)

replace github.com/oncommit/oncommit => ../../
