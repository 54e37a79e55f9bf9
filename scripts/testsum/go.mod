module github.com/oncommit/oncommit/scripts/testsum

go 1.26.8
