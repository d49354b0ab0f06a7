//! Line charts as SVG, one line per configuration.

use std::path::Path;

use plotters::prelude::*;

use super::ScenarioError;

/// What one chart shows.
pub struct Chart<'a> {
    pub caption: &'a str,
    pub x_desc: &'a str,
    pub y_desc: &'a str,
    /// One named line each.
    pub lines: &'a [(String, Vec<(f64, f64)>)],
    /// A shaded span of x (the incident), if any.
    pub band: Option<(f64, f64)>,
    /// The y axis reaches at least this.
    pub y_floor: f64,
}

/// Goodput against offered load (as multiples of `capacity`), one line per configuration in
/// the order they first appear.
pub fn lines_by_config<'a>(
    points: impl IntoIterator<Item = &'a super::Point>,
    capacity: f64,
) -> Vec<(String, Vec<(f64, f64)>)> {
    let mut lines: Vec<(String, Vec<(f64, f64)>)> = Vec::new();
    for p in points {
        let at = (p.offered / capacity, p.goodput);
        match lines.iter_mut().find(|(name, _)| *name == p.config) {
            Some((_, line)) => line.push(at),
            None => lines.push((p.config.clone(), vec![at])),
        }
    }
    lines
}

pub fn draw(path: &Path, c: &Chart<'_>) -> Result<(), ScenarioError> {
    let plot = |e: &dyn std::fmt::Display| ScenarioError::Plot(e.to_string());
    let points = || c.lines.iter().flat_map(|(_, l)| l.iter());
    let max_x = points().map(|p| p.0).fold(1.0, f64::max);
    let max_y = points().map(|p| p.1).fold(c.y_floor, f64::max) * 1.1;
    let root = SVGBackend::new(path, (800, 500)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| plot(&e))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(c.caption, ("sans-serif", 22))
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(60)
        .build_cartesian_2d(0.0..max_x * 1.05, 0.0..max_y.max(f64::MIN_POSITIVE))
        .map_err(|e| plot(&e))?;
    chart
        .configure_mesh()
        .x_desc(c.x_desc)
        .y_desc(c.y_desc)
        .draw()
        .map_err(|e| plot(&e))?;
    if let Some((from, to)) = c.band {
        chart
            .draw_series(std::iter::once(Rectangle::new(
                [(from, 0.0), (to, max_y)],
                RGBColor(255, 200, 200).mix(0.4).filled(),
            )))
            .map_err(|e| plot(&e))?;
    }
    for (i, (name, line)) in c.lines.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        chart
            .draw_series(LineSeries::new(line.clone(), color.stroke_width(2)))
            .map_err(|e| plot(&e))?
            .label(name.as_str())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
        chart
            .draw_series(
                line.iter()
                    .map(|&(x, y)| Circle::new((x, y), 3, color.filled())),
            )
            .map_err(|e| plot(&e))?;
    }
    chart
        .configure_series_labels()
        .border_style(BLACK)
        .background_style(WHITE.mix(0.8))
        .draw()
        .map_err(|e| plot(&e))?;
    root.present().map_err(|e| plot(&e))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_and_one_marker_per_point_with_the_incident_shaded() {
        let dir = std::env::temp_dir().join(format!("sluice-plot-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("chart.svg");
        let lines = vec![
            ("direct".to_string(), vec![(0.0, 5.0), (1.0, 2.0)]),
            (
                "sluice-shed".to_string(),
                vec![(0.0, 5.0), (1.0, 4.5), (2.0, 5.0)],
            ),
        ];
        let chart = Chart {
            caption: "Goodput over time",
            x_desc: "s",
            y_desc: "req/s",
            lines: &lines,
            band: Some((0.5, 1.5)),
            y_floor: 1.0,
        };
        draw(&path, &chart).unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        assert!(svg.starts_with("<svg"), "{}", &svg[..80.min(svg.len())]);
        assert!(svg.contains("direct") && svg.contains("sluice-shed"));
        assert_eq!(svg.matches("<circle").count(), 5, "one marker per point");
        assert!(svg.contains("Goodput over time"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
