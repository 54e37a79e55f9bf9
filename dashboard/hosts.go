package dashboard

import (
	"fmt"
	"net"
	"net/http"
	"strings"

	"github.com/oncommit/oncommit/outbox"
)

// hostName returns the host of a Host header or an AllowedHosts entry,
// without its port and brackets, in lower case, without a final dot (an
// IP address in its shortest form).
func hostName(s string) string {
	if h, _, err := net.SplitHostPort(s); err == nil {
		s = h
	}
	s = strings.Trim(s, "[]")
	if ip := net.ParseIP(s); ip != nil {
		return ip.String()
	}
	return strings.TrimSuffix(strings.ToLower(s), ".")
}

// checkHosts refuses an AllowedHosts entry that names no host.
func checkHosts(hosts []string) error {
	for _, h := range hosts {
		if h == "*" || net.ParseIP(strings.Trim(h, "[]")) != nil {
			continue
		}
		name := strings.TrimSuffix(strings.ToLower(h), ".")
		if name == "" || strings.Trim(name, "abcdefghijklmnopqrstuvwxyz0123456789-.") != "" {
			return &outbox.ConfigError{Field: "AllowedHosts", Reason: fmt.Sprintf("%q is not a host name or IP address (give it without a scheme or port; \"*\" allows every host)", h)}
		}
	}
	return nil
}

// hostAllowed reports whether r names a host the dashboard answers to:
// localhost and the names under .localhost, a loopback address, the
// address r arrived on, or one of Config.AllowedHosts.
func (h *Handler) hostAllowed(r *http.Request) bool {
	name := hostName(r.Host)
	if name == "" {
		return false
	}
	if name == "localhost" || strings.HasSuffix(name, ".localhost") || h.hosts["*"] || h.hosts[name] {
		return true
	}
	ip := net.ParseIP(name)
	if ip == nil {
		return false
	}
	if ip.IsLoopback() {
		return true
	}
	local, ok := r.Context().Value(http.LocalAddrContextKey).(*net.TCPAddr)
	return ok && local.IP.Equal(ip)
}

// hostSet returns the names of hosts, normalised, for hostAllowed.
func hostSet(hosts []string) map[string]bool {
	set := map[string]bool{}
	for _, h := range hosts {
		if h == "*" {
			set["*"] = true
			continue
		}
		set[hostName(h)] = true
	}
	return set
}
