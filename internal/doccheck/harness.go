package doccheck

import (
	"bytes"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"maps"
	"slices"
	"strings"
)

// Harnesses are the declared ways a fragment becomes a file: "decls" puts
// it at package level, "stmts" into a function body that returns an error.
// Both see Prelude's declarations, which stand for what a fragment takes
// from its surroundings (a pool, a context, the checkout of the docs).
var Harnesses = []string{"decls", "stmts"}

// Prelude declares what the documentation's fragments refer to without
// defining. Stmts fragments also see the parameters of stmtsFunc.
const Prelude = `
type CheckoutRequest struct {
	Customer    string
	AmountCents int64
}

type CheckoutState struct {
	OrderID  int64
	ChargeID string
}

type Charge struct{ ID string }

type paymentsClient interface {
	Charge(ctx context.Context, key string, amountCents int64) (*Charge, error)
}

var payments paymentsClient

type Order struct {
	SKU    string
	Amount int64
}

type State struct{}

type fakeProvider struct{}

func newFakeProvider(t *testing.T) *fakeProvider                                       { return nil }
func checkout(*fakeProvider) *workflow.Workflow[Order, State]                           { return nil }
func oneChargePerOrder(context.Context, *pgxpool.Pool, paymentsClient) error           { return nil }
func newFakePayments(t *testing.T) paymentsClient                                     { return nil }

const ordersTable = ""
func writeTransfer(ctx context.Context, tx pgx.Tx, body io.Reader) error                { return nil }
func sendAndRecordReceipt(ctx context.Context, tx pgx.Tx, payload json.RawMessage) error { return nil }
func authenticate(next http.Handler) http.Handler                                        { return next }

func createOrder(ctx context.Context, tx pgx.Tx, r *phase.Run[CheckoutRequest, CheckoutState]) error  { return nil }
func recordCharge(ctx context.Context, tx pgx.Tx, r *phase.Run[CheckoutRequest, CheckoutState]) error { return nil }
func chargeCard(ctx context.Context, c *foreign.Call[CheckoutRequest, CheckoutState]) error            { return nil }
func ship(ctx context.Context, c *foreign.Call[CheckoutRequest, CheckoutState]) error                  { return nil }

type authInfo struct{ Org, User string }
type authenticator struct{}

func (authenticator) From(context.Context) authInfo { return authInfo{} }

var auth authenticator
`

// checkoutDecl declares the docs' Checkout and relay for the fragments
// that use them rather than define them.
const checkoutDecl = `
var Checkout, CheckoutNext *workflow.Workflow[CheckoutRequest, CheckoutState]

var relay *outbox.Relay
`

// sharedDecls are checkoutDecl's declarations one by one, for declaration
// fragments, which may define some of them.
var sharedDecls = map[string]string{
	"Checkout": "var Checkout *workflow.Workflow[CheckoutRequest, CheckoutState]\n",
	"relay":    "var relay *outbox.Relay\n",
}

// stmtsFunc opens the function a stmts fragment runs in.
const stmtsFunc = `func fragment(t *testing.T, ctx context.Context, pool *pgxpool.Pool, tx pgx.Tx, r *http.Request,
	mux *http.ServeMux, engine *workflow.Engine, cfg idemhttp.Config, req CheckoutRequest,
	tenant, user, idempotencyKey, orderID string, body []byte, receipt any) error {
`

// importPaths are the packages a generated file may use, by name.
var importPaths = map[string]string{
	"admin": "github.com/onceflow/onceflow/admin", "bytes": "bytes", "context": "context", "errors": "errors", "fmt": "fmt", "http": "net/http", "io": "io",
	"json": "encoding/json", "slog": "log/slog", "testing": "testing", "time": "time",
	"pgx": "github.com/jackc/pgx/v5", "pgxpool": "github.com/jackc/pgx/v5/pgxpool",
	"crashtest": "github.com/onceflow/onceflow/crashtest", "foreign": "github.com/onceflow/onceflow/foreign",
	"idemhttp": "github.com/onceflow/onceflow/idemhttp", "metrics": "github.com/onceflow/onceflow/metrics",
	"migrations": "github.com/onceflow/onceflow/migrations", "outbox": "github.com/onceflow/onceflow/outbox",
	"phase": "github.com/onceflow/onceflow/phase", "recovery": "github.com/onceflow/onceflow/recovery",
	"sweeper": "github.com/onceflow/onceflow/sweeper", "workflow": "github.com/onceflow/onceflow/workflow",
}

// Wrap returns the Go file that compiles the fragment b in package pkg
// under harness, with a //line directive so that errors name the Markdown
// file and line. The fragment's own names are used once (_ = name) so that
// a fragment that shows how to get a value need not also use it, and the
// imports are the packages the file names.
func Wrap(b Block, harness, pkg string) ([]byte, error) {
	var src strings.Builder
	src.WriteString(Prelude)
	line := fmt.Sprintf("//line %s:%d\n", b.Path, b.Line+1)
	switch harness {
	case "decls":
		f, err := parser.ParseFile(token.NewFileSet(), "", "package p\n"+b.Text, parser.SkipObjectResolution)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", b.Where(), err)
		}
		for _, name := range slices.Sorted(maps.Keys(sharedDecls)) {
			if !declares(f, name) {
				src.WriteString(sharedDecls[name])
			}
		}
		src.WriteString(line + b.Text)
	case "stmts":
		src.WriteString(checkoutDecl + stmtsFunc + line + b.Text)
		names, err := definedNames(src.String() + "\n}\n")
		if err != nil {
			return nil, fmt.Errorf("%s: %w", b.Where(), err)
		}
		for _, n := range names {
			src.WriteString("_ = " + n + "\n")
		}
		src.WriteString("return nil\n}\n")
	default:
		return nil, fmt.Errorf("%s: no harness %q (have %s)", b.Where(), harness, strings.Join(Harnesses, ", "))
	}
	return withImports(pkg, src.String())
}

// declares reports whether f declares name at package level.
func declares(f *ast.File, name string) bool {
	for _, d := range f.Decls {
		switch d := d.(type) {
		case *ast.FuncDecl:
			if d.Name.Name == name {
				return true
			}
		case *ast.GenDecl:
			for _, spec := range d.Specs {
				switch spec := spec.(type) {
				case *ast.ValueSpec:
					if slices.ContainsFunc(spec.Names, func(id *ast.Ident) bool { return id.Name == name }) {
						return true
					}
				case *ast.TypeSpec:
					if spec.Name.Name == name {
						return true
					}
				}
			}
		}
	}
	return false
}

// definedNames are the names the top-level statements of the function
// fragment define.
func definedNames(src string) ([]string, error) {
	f, err := parser.ParseFile(token.NewFileSet(), "", "package p\n"+src, parser.SkipObjectResolution)
	if err != nil {
		return nil, err
	}
	var names []string
	add := func(id *ast.Ident) {
		if id.Name != "_" && !slices.Contains(names, id.Name) {
			names = append(names, id.Name)
		}
	}
	for _, d := range f.Decls {
		fn, ok := d.(*ast.FuncDecl)
		if !ok || fn.Name.Name != "fragment" {
			continue
		}
		for _, s := range fn.Body.List {
			switch s := s.(type) {
			case *ast.AssignStmt:
				if s.Tok == token.DEFINE {
					for _, e := range s.Lhs {
						if id, ok := e.(*ast.Ident); ok {
							add(id)
						}
					}
				}
			case *ast.DeclStmt:
				if g, ok := s.Decl.(*ast.GenDecl); ok && g.Tok == token.VAR {
					for _, spec := range g.Specs {
						for _, id := range spec.(*ast.ValueSpec).Names {
							add(id)
						}
					}
				}
			}
		}
	}
	return names, nil
}

// withImports puts package pkg and the imports src uses in front of src.
func withImports(pkg, src string) ([]byte, error) {
	f, err := parser.ParseFile(token.NewFileSet(), "", "package p\n"+src, 0)
	if err != nil {
		return nil, err
	}
	used := map[string]bool{}
	ast.Inspect(f, func(n ast.Node) bool {
		if sel, ok := n.(*ast.SelectorExpr); ok {
			if id, ok := sel.X.(*ast.Ident); ok && id.Obj == nil && importPaths[id.Name] != "" {
				used[id.Name] = true
			}
		}
		return true
	})
	var out bytes.Buffer
	fmt.Fprintf(&out, "package %s\n\nimport (\n", pkg)
	for _, name := range slices.Sorted(maps.Keys(used)) {
		fmt.Fprintf(&out, "\t%q\n", importPaths[name])
	}
	out.WriteString(")\n" + src) // not gofmt'd: a //line directive must start its line
	return out.Bytes(), nil
}
