package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/onceflow/onceflow/foreign"
	"github.com/onceflow/onceflow/phase"
	"github.com/onceflow/onceflow/workflow"
)

// shopSchema is the realistic checkout's business tables: products with
// their stock, orders indexed by customer, and order lines with foreign
// keys to both. 10,000 products, so that concurrent orders rarely wait
// for one another's stock.
const shopSchema = `
CREATE TABLE bench_products (id bigint PRIMARY KEY, sku text NOT NULL UNIQUE, price bigint NOT NULL,
	stock bigint NOT NULL);
CREATE TABLE bench_shop_orders (id bigserial PRIMARY KEY, key text NOT NULL, customer_id bigint NOT NULL,
	total bigint NOT NULL, status text NOT NULL, payment_ref text, created_at timestamptz NOT NULL DEFAULT now());
CREATE INDEX ON bench_shop_orders (customer_id, created_at);
CREATE TABLE bench_order_lines (order_id bigint NOT NULL REFERENCES bench_shop_orders (id), line int NOT NULL,
	product_id bigint NOT NULL REFERENCES bench_products (id), quantity int NOT NULL, price bigint NOT NULL,
	PRIMARY KEY (order_id, line));
CREATE INDEX ON bench_order_lines (product_id);
INSERT INTO bench_products SELECT i, 'sku-' || i, 100 + i % 900, 1000000000000 FROM generate_series(1, 10000) i;
ANALYZE bench_products;`

const shopProducts = 10_000

// Cart is the realistic checkout's request: a customer's three lines.
type Cart struct {
	Customer int64  `json:"customer"`
	Items    []Item `json:"items"`
}

// Item is one line of a cart.
type Item struct {
	Product  int64 `json:"product"`
	Quantity int   `json:"quantity"`
	Price    int64 `json:"price"`
}

// Placed is the realistic checkout's state.
type Placed struct {
	OrderID int64 `json:"order_id"`
}

// cartFor is the i-th cart: three distinct products in ascending order, as
// an application orders its row locks to avoid deadlocks.
func cartFor(i int64) Cart {
	first := i*7919%(shopProducts-2) + 1
	items := make([]Item, 3)
	for j := range items {
		items[j] = Item{Product: first + int64(j), Quantity: 1 + j, Price: 100 + (first+int64(j))%900}
	}
	return Cart{Customer: i%1000 + 1, Items: items}
}

// placeOrder is the realistic checkout's first transaction, as an
// application writes it: the order, its lines in one statement, and a
// checked stock decrement per product.
func placeOrder(ctx context.Context, tx pgx.Tx, key string, cart Cart) (int64, error) {
	var total int64
	lines := make([]any, 0, 4*len(cart.Items))
	values := ""
	for n, it := range cart.Items {
		total += it.Price * int64(it.Quantity)
		values += fmt.Sprintf(",($1, %d, $%d, $%d, $%d)", n+1, 3*n+2, 3*n+3, 3*n+4)
		lines = append(lines, it.Product, it.Quantity, it.Price)
	}
	var id int64
	err := tx.QueryRow(ctx, `INSERT INTO bench_shop_orders (key, customer_id, total, status) VALUES ($1, $2, $3, 'new')
		RETURNING id`, key, cart.Customer, total).Scan(&id)
	if err != nil {
		return 0, err
	}
	_, err = tx.Exec(ctx, `INSERT INTO bench_order_lines (order_id, line, product_id, quantity, price) VALUES `+values[1:],
		append([]any{id}, lines...)...)
	if err != nil {
		return 0, err
	}
	for _, it := range cart.Items {
		tag, err := tx.Exec(ctx, `UPDATE bench_products SET stock = stock - $2 WHERE id = $1 AND stock >= $2`,
			it.Product, it.Quantity)
		if err != nil {
			return 0, err
		}
		if tag.RowsAffected() != 1 {
			return 0, fmt.Errorf("product %d is out of stock", it.Product)
		}
	}
	return id, nil
}

// markPaid is the realistic checkout's second transaction.
func markPaid(ctx context.Context, tx pgx.Tx, id int64, key string) error {
	_, err := tx.Exec(ctx, `UPDATE bench_shop_orders SET status = 'paid', payment_ref = $2 WHERE id = $1`, id, "ch_"+key)
	return err
}

// realisticWorkflow is the realistic checkout: two atomic phases around a
// foreign no-op, as the micro checkout.
func realisticWorkflow() *workflow.Workflow[Cart, Placed] {
	return workflow.Define("shop_checkout",
		phase.Atomic("place_order", func(ctx context.Context, tx pgx.Tx, r *phase.Run[Cart, Placed]) error {
			id, err := placeOrder(ctx, tx, r.Key.ID, r.Request)
			r.State.OrderID = id
			return err
		}),
		foreign.Mutation("charge", func(context.Context, *foreign.Call[Cart, Placed]) error { return nil }),
		phase.Atomic("record_charge", func(ctx context.Context, tx pgx.Tx, r *phase.Run[Cart, Placed]) error {
			return markPaid(ctx, tx, r.State.OrderID, r.Key.ID)
		}),
	)
}

func realisticOnceflow(e *workflow.Engine, wf *workflow.Workflow[Cart, Placed], prefix string) op {
	return func(ctx context.Context, i int64) error {
		_, err := wf.Run(ctx, e, workflow.Key{Tenant: "bench", ID: fmt.Sprintf("%s%d", prefix, i)}, cartFor(i))
		return err
	}
}

// realisticFloor is the same business statements in the same
// transactions, with no onceflow; with k's key record written by hand in
// them unless k is nil.
func realisticFloor(db *pgxpool.Pool, prefix string, k *keyRecord) op {
	return func(ctx context.Context, i int64) error {
		key := fmt.Sprintf("%s%d", prefix, i)
		cart := cartFor(i)
		var id int64
		err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) (err error) {
			if id, err = placeOrder(ctx, tx, key, cart); err != nil || k == nil {
				return err
			}
			request, err := json.Marshal(cart)
			if err != nil {
				return err
			}
			return k.insert(ctx, tx, i, request, fmt.Appendf(nil, `{"order_id":%d}`, id))
		})
		if err != nil {
			return err
		}
		return pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
			err := markPaid(ctx, tx, id, key)
			if err == nil {
				err = k.complete(ctx, tx, i, fmt.Appendf(nil, `{"order_id":%d}`, id))
			}
			return err
		})
	}
}

// realisticCase runs the realistic checkout and its floor through the
// network (Config.NetworkDelay), in alternation.
func realisticCase(ctx context.Context, srv *server, cfg Config) ([]Result, error) {
	direct, err := srv.newDatabase(ctx, 2)
	if err != nil {
		return nil, err
	}
	defer direct.close()
	if _, err := direct.pool.Exec(ctx, shopSchema); err != nil {
		return nil, err
	}
	db, err := direct.overNetwork(ctx, cfg.NetworkDelay, 32)
	if err != nil {
		return nil, err
	}
	defer db.close()
	wf := realisticWorkflow()
	engine, err := workflow.NewEngine(db.pool, workflow.Config{})
	if err != nil {
		return nil, err
	}
	results, err := networkCost(ctx, direct, db, cfg.NetworkDelay)
	if err != nil {
		return nil, err
	}
	for _, c := range []int{1, 16} {
		once, floor, gaveUp, err := throughput(ctx, cfg.Rounds, cfg.Round, c,
			realisticOnceflow(engine, wf, fmt.Sprintf("c%d-", c)), realisticFloor(db.pool, fmt.Sprintf("f%d-", c), nil))
		if err != nil {
			return nil, err
		}
		r := ratio(fmt.Sprintf("realistic checkout (3 lines + stock), network, concurrency %d", c), once, floor, "/s", 0.90)
		r.Note = gaveUpNote(gaveUp)
		bound, err := keyedBound(ctx, cfg, c, "realistic checkout",
			realisticFloor(db.pool, fmt.Sprintf("kf%d-", c), &keyRecord{prefix: fmt.Sprintf("k%d-", c)}), realisticFloor(db.pool, fmt.Sprintf("bf%d-", c), nil))
		if err != nil {
			return nil, err
		}
		results = append(results, r, bound)
	}
	counts, err := countPerOp(ctx, srv, db, 200, "realistic checkout",
		realisticOnceflow(engine, wf, "count-"), realisticFloor(db.pool, "count-f-", nil))
	if err != nil {
		return nil, err
	}
	return append(results, counts...), nil
}

// networkCost measures what the network adds to a round trip: the median
// SELECT 1 through it against the same directly.
func networkCost(ctx context.Context, direct, db *database, delay time.Duration) ([]Result, error) {
	if delay <= 0 {
		return nil, nil
	}
	var p50 [2]float64
	for i, d := range []*database{db, direct} {
		pool := d.pool
		var next atomic.Int64
		ds, err := latencies(ctx, 200, func(ctx context.Context, _ int64) error {
			_, err := pool.Exec(ctx, `SELECT 1`)
			return err
		}, &next)
		if err != nil {
			return nil, err
		}
		p50[i] = ms(percentile(ds, 50))
	}
	return []Result{{Figure: "network: SELECT 1 round trip, p50, through the proxy vs direct", Onceflow: p50[0], Floor: p50[1],
		Unit: "ms", Ratio: p50[0] - p50[1], Target: "reported", Pass: true,
		Note: fmt.Sprintf("ratio column: the difference; nominal %s (2 × %s)", 2*delay, delay)}}, nil
}
